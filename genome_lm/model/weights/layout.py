"""The on-disk key layout (safetensors) against upstream's modules and the dtype policy, shared by
`reader.py` and `writer.py`. Both layouts are read; upstream converts at load time
(`transformers.conversion_mapping`, "glm5_next"):

    on disk (per layer)                          upstream module
    self_attn.{f_a_proj,f_b_proj,dt_bias,A_log}  self_attn.forget_gate.{...}
    hc_{attn,ffn}_{fn,base,scale}                {attn,ffn}_hc.{fn,base,scale}
    self_attn.{q,k,v}_conv1d.weight [Q, 1, K]    self_attn.conv1d.weight [3Q, 1, K] (concat)
    mlp.experts.{e}.{gate,up}_proj.weight [I, D] mlp.experts.gate_up_proj [E, 2I, D] (stack, cat)
    mlp.experts.{e}.down_proj.weight [D, I]      mlp.experts.down_proj [E, D, I] (stack)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterator, Mapping

import torch

from genome_lm.model.upstream import KEEP_IN_FP32

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM

TensorSpec = tuple[str, tuple[int, ...], torch.dtype]  # upstream name, full shape, dtype

_RENAMES = (  # (on-disk, upstream), applied as plain substring replacements
    [(f"self_attn.{n}", f"self_attn.forget_gate.{n}") for n in ("f_a_proj.", "f_b_proj.", "dt_bias", "A_log")]
    + [(f"hc_{where}_{n}", f"{where}_hc.{n}") for where in ("attn", "ffn") for n in ("fn", "base", "scale")]
)

_EXPERT_PARTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}  # upstream -> per expert


def to_disk_layout(name: str, tensor: torch.Tensor, start: int = 0,
                   rows: int | None = None) -> Iterator[tuple[str, int, torch.Tensor]]:
    """Rows `[start, start + len(tensor))` of upstream tensor `name` (`rows` in all; None: whole) ->
    `(on-disk name, first row there, view of tensor)` for each on-disk tensor behind them."""
    prefix, _, last = name.rpartition(".")
    if prefix.endswith(".mlp.experts") and last in _EXPERT_PARTS:
        pieces = tensor.chunk(len(_EXPERT_PARTS[last]), dim=1)  # gate_up_proj: gate, up [E, I, D]
        for e in range(tensor.shape[0]):
            for part, piece in zip(_EXPERT_PARTS[last], pieces):
                yield f"{prefix}.{start + e}.{part}.weight", 0, piece[e]
    elif name.endswith(".self_attn.conv1d.weight"):  # [3Q, 1, K] from q, k, v [Q, 1, K]
        prefix, q, stop = name.removesuffix(".conv1d.weight"), (rows or len(tensor)) // 3, start + len(tensor)
        for i, qkv in enumerate("qkv"):
            lo, hi = max(start, i * q), min(stop, (i + 1) * q)
            if lo < hi:
                yield f"{prefix}.{qkv}_conv1d.weight", lo - i * q, tensor[lo - start:hi - start]
    else:
        for disk, ours in _RENAMES:
            name = name.replace(ours, disk)
        yield name, start, tensor


_VISION_PREFIXES = ("model.visual.", "visual.", "model.vision", "vision_tower.", "model.vision_tower.")
_MTP_PARTS = (".shared_head.", ".eh_proj.", ".enorm.", ".hnorm.")
_TEXT_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.",
                  "language_model.lm_head.": "lm_head."}  # a full checkpoint's text keys -> the causal LM's
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def text_key(key: str, num_layers: int) -> str | None:
    """Checkpoint key -> causal-LM key, or None to skip (vision, MTP, layers past `num_layers`)."""
    if key.startswith((*_VISION_PREFIXES, "mtp.", "model.mtp.")):
        return None
    if prefix := next((p for p in _TEXT_PREFIXES if key.startswith(p)), None):
        key = _TEXT_PREFIXES[prefix] + key.removeprefix(prefix)
    elif not key.startswith(("model.", "lm_head.")):
        key = "model." + key  # a bare text model's keys
    if any(part in key for part in _MTP_PARTS):
        return None
    if (m := _LAYER.match(key)) and int(m.group(1)) >= num_layers:
        return None
    return key


def keep_fp32(name: str) -> bool:
    """Parameters upstream keeps in float32 under bf16/fp16 (`_keep_in_fp32_modules_strict`)."""
    return any(pattern in name for pattern in KEEP_IN_FP32)


def cast_dtype(name: str, stored: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    """`dtype` for tensor `name`, float32 for upstream's exceptions under bf16/fp16 (None or not float: `stored`)."""
    if dtype is None or not stored.is_floating_point:
        return stored
    if keep_fp32(name) and dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return dtype


def cast_tensor(name: str, tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor.to(cast_dtype(name, tensor.dtype, dtype))


def model_tensors(model: Glm5NextCausalLM,
                  state_dict: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The tensors read and written, in writing order: the state dict without a tied `lm_head.weight`."""
    state = dict(model.state_dict() if state_dict is None else state_dict)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state
