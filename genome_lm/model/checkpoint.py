"""`save_pretrained(model, dir)`: a Hugging Face-style text-only checkpoint directory.

Layout written (atomically: built under a temporary name beside `dir`, then renamed):
- `config.json`: the upstream `Glm5NextTextConfig` (`model_type: glm5_next_text`), `dtype` set;
- `model.safetensors` (or `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json` past
  `max_shard_bytes`): keys `model.*` and `lm_head.weight` in the on-disk layout real GLM-5.3-Flash
  checkpoints use (`convert.py`: per-expert `mlp.experts.{e}.*_proj`, `{q,k,v}_conv1d`,
  `hc_attn_fn`, `self_attn.f_a_proj`, ...);
- tokenizer files copied from the source checkpoint, when it had them (so `token_map` still works).

Upstream loads it back: `Glm5NextTextModel.from_pretrained(dir)` takes the `model.*` part (its
`base_model_prefix` is "model"; `lm_head.weight` is reported as unused), and
`genome_lm.model.build(dir)` rebuilds the causal LM identically.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from genome_lm.errors import GenomeLMError
from genome_lm.model.convert import to_disk_layout
from genome_lm.utils import atomic_directory

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30


def disk_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The causal LM's tensors under on-disk checkpoint names (`model.*`, `lm_head.weight`).

    `state_dict`: use these tensors instead of `model.state_dict()` (e.g. the full state dict a
    sharded model gathered on one rank)."""
    state = dict(model.state_dict() if state_dict is None else state_dict)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    out = {}
    for name, tensor in state.items():
        if tensor.is_meta:
            raise GenomeLMError(f"model: cannot save a model built on the meta device ({name} has no data)")
        for disk_name, part in to_disk_layout(name, tensor.detach()):
            out[disk_name] = part.contiguous().cpu()
    return out


def _shards(state: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards, current, size = [], {}, 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    return shards + [current]


def save_pretrained(
    model: nn.Module,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write `model` (a `Glm5NextCausalLM`) to `out_dir` as a Hugging Face-style directory.

    Nothing appears at `out_dir` until the directory is complete. With `overwrite`, an existing
    `out_dir` is replaced only after the new one is complete; otherwise it is an error.
    `state_dict`: the tensors to write, if not `model.state_dict()` (see `disk_state_dict`).
    """
    out_dir = Path(out_dir)
    state = disk_state_dict(model, state_dict)
    config = model.config.to_dict()
    config["architectures"] = ["Glm5NextTextModel"]
    config["dtype"] = str(model.lm_head.weight.dtype).removeprefix("torch.")
    shards = _shards(state, max_shard_bytes)
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if len(shards) == 1:
            save_file(shards[0], str(tmp / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards, start=1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(shard, fname))
            total = sum(t.numel() * t.element_size() for t in state.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        source = getattr(model, "source", None)
        if source and Path(source).is_dir():
            for name in TOKENIZER_FILES:
                if (Path(source) / name).is_file():
                    shutil.copy2(Path(source) / name, tmp / name)
    return out_dir
