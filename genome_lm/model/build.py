"""`build`: the causal LM from a preset (upstream initialisation: seed first; `glm53-flash` on meta
unless a non-CPU `device` is given) or a checkpoint directory (built on meta, then filled tensor by
tensor: peak host memory about one model). Nothing is set on the model or its config afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from genome_lm.errors import GenomeLMError
from genome_lm.model.causal_lm import Glm5NextCausalLM
from genome_lm.model.contract import check_model, check_torch, summary
from genome_lm.model.presets import META_ONLY, PRESETS, preset_config
from genome_lm.model.upstream import route_cpu_to_torch
from genome_lm.model.weights.layout import cast_tensor
from genome_lm.model.weights.reader import LoadReport, load_weights_, read_text_config


@dataclass(frozen=True)
class BuiltModel:
    """The causal LM, its preset or directory, its weights' dtype (float32 exceptions aside; None: a float32
    preset), what reading a checkpoint found (None: nothing read)."""

    model: Glm5NextCausalLM
    source: str
    dtype: torch.dtype | None
    load_report: LoadReport | None = None


def build(source: str | Path, *, dtype: torch.dtype | str | None = None, device: str | torch.device | None = None,
          meta: bool | None = None, **config_overrides) -> BuiltModel:
    """`dtype` (or its name): upstream's float32 exceptions stay float32; None: float32 for presets, as stored
    for checkpoints. `meta`: nothing allocated. `config_overrides`: `Glm5NextTextConfig` fields."""
    route_cpu_to_torch()
    if isinstance(dtype, str):
        value = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(value, torch.dtype):
            raise GenomeLMError(f"model.dtype: unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        dtype = value
    source_str = str(source)
    on_cpu = device is None or torch.device(device).type == "cpu"
    preset = source_str in PRESETS
    if preset:
        config = preset_config(source_str, **config_overrides)
        if source_str in META_ONLY:
            if meta is False and on_cpu:
                raise GenomeLMError(f"model: {source_str} is too large to materialise on CPU; build it with meta=True "
                                    "(counting, planning) or on a GPU device")
            meta = on_cpu if meta is None else meta
    else:
        config = read_text_config(source_str, **config_overrides)
    with torch.device("meta" if meta or not preset else device or "cpu"):  # a checkpoint's is filled below
        model = Glm5NextCausalLM(config)
    report = None if preset or meta else load_weights_(model, source_str, device or "cpu", dtype=dtype,
                                                       stored_dtypes=True)
    if dtype is not None and report is None:  # else the weights were read in it
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            tensor.data = cast_tensor(name, tensor.data, dtype)
    check_model(model)  # upstream's attributes that genome_lm reads (the symbols: on importing upstream)
    if dtype is None and isinstance(config.dtype, torch.dtype):  # a checkpoint's, from its config.json
        dtype = config.dtype
    return BuiltModel(model, source_str, dtype, report)


def check_upstream() -> str:
    """Check all of `contract.py` (symbols: on import; attributes: a tiny meta model) -> its one-line summary."""
    build("glm53-tiny", meta=True)  # runs check_model
    check_torch()
    return summary()

