"""Key layouts of GLM-5.3-Flash weights: on-disk checkpoints vs upstream's modules.

Checkpoints (what `Glm5NextForConditionalGeneration.save_pretrained` writes, and what a download
of the real model holds) differ from upstream's module parameters in a few places, which
upstream converts at load time (`transformers.conversion_mapping`, "glm5_next"):

    on disk (per layer)                          upstream module
    self_attn.{f_a_proj,f_b_proj,dt_bias,A_log}  self_attn.forget_gate.{...}
    hc_{attn,ffn}_{fn,base,scale}                {attn,ffn}_hc.{fn,base,scale}
    self_attn.{q,k,v}_conv1d.weight [Q, 1, K]    self_attn.conv1d.weight [3Q, 1, K] (concat)
    mlp.experts.{e}.{gate,up}_proj.weight [I, D] mlp.experts.gate_up_proj [E, 2I, D] (stack, cat)
    mlp.experts.{e}.down_proj.weight [D, I]      mlp.experts.down_proj [E, D, I] (stack)

Names here are relative to the text model (`layers.3.mlp...`, `embed_tokens.weight`,
`norm.weight`). Prefixes (`model.language_model.`, vision, MTP) are handled in `load.py`.
`ModuleLayout` accepts either layout, piece by piece (checkpoint shards may split a layer's
experts across files), and yields upstream names once a tensor is complete. `to_disk_layout`
goes the other way (saving); `read_rows` assembles any dim-0 slice of an upstream tensor from
the on-disk tensors behind it (each rank of a sharded model reading only its rows).
"""

from __future__ import annotations

import re
from typing import Callable, Iterator

import torch

_RENAMES = [  # (on-disk, upstream), applied as plain substring replacements
    ("self_attn.f_a_proj.", "self_attn.forget_gate.f_a_proj."),
    ("self_attn.f_b_proj.", "self_attn.forget_gate.f_b_proj."),
    ("self_attn.dt_bias", "self_attn.forget_gate.dt_bias"),
    ("self_attn.A_log", "self_attn.forget_gate.A_log"),
    ("hc_attn_fn", "attn_hc.fn"),
    ("hc_attn_base", "attn_hc.base"),
    ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"),
    ("hc_ffn_base", "ffn_hc.base"),
    ("hc_ffn_scale", "ffn_hc.scale"),
]
_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_CONV = re.compile(r"^(?P<prefix>.*\.self_attn)\.(?P<qkv>[qkv])_conv1d\.weight$")


def _rename_to_upstream(name: str) -> str:
    for disk, ours in _RENAMES:
        if disk in name and ours not in name:
            name = name.replace(disk, ours)
    return name


def _rename_to_disk(name: str) -> str:
    for disk, ours in _RENAMES:
        name = name.replace(ours, disk)
    return name


class ModuleLayout:
    """Collects on-disk tensors and yields `(upstream_name, tensor)` as soon as each is complete.

    Usage: `for name, t in layout.add(key, tensor): ...` for every key; `layout.pending()`
    lists pieces still waiting for their siblings after the last shard (an incomplete checkpoint).
    """

    def __init__(self, num_experts: int):
        self.num_experts = num_experts
        self._experts: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
        self._conv: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        if m := _EXPERT.match(name):
            parts = self._experts.setdefault(m["prefix"], {})
            parts[(m["proj"], int(m["e"]))] = tensor
            if len(parts) == 3 * self.num_experts:
                del self._experts[m["prefix"]]
                yield from self._merge_experts(m["prefix"], parts)
        elif m := _CONV.match(name):
            parts = self._conv.setdefault(m["prefix"], {})
            parts[m["qkv"]] = tensor
            if len(parts) == 3:
                del self._conv[m["prefix"]]
                yield f"{m['prefix']}.conv1d.weight", torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
        else:
            yield _rename_to_upstream(name), tensor

    def _merge_experts(self, prefix: str, parts) -> Iterator[tuple[str, torch.Tensor]]:
        experts = range(self.num_experts)
        gate = torch.stack([parts[("gate_proj", e)] for e in experts])  # [E, I, D]
        up = torch.stack([parts[("up_proj", e)] for e in experts])  # [E, I, D]
        yield f"{prefix}.gate_up_proj", torch.cat([gate, up], dim=1)  # [E, 2I, D]
        yield f"{prefix}.down_proj", torch.stack([parts[("down_proj", e)] for e in experts])  # [E, D, I]

    def pending(self) -> list[str]:
        left = [f"{p}.{proj}.{e}" for p, d in self._experts.items() for (proj, e) in d]
        left += [f"{p}.{qkv}_conv1d" for p, d in self._conv.items() for qkv in d]
        return sorted(left)


def to_disk_layout(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """One upstream parameter -> its on-disk tensors (the inverse of `ModuleLayout`)."""
    if name.endswith(".mlp.experts.gate_up_proj"):
        prefix = name.removesuffix(".gate_up_proj")
        gate, up = tensor.chunk(2, dim=1)  # [E, I, D] each
        for e in range(tensor.shape[0]):
            yield f"{prefix}.{e}.gate_proj.weight", gate[e]
            yield f"{prefix}.{e}.up_proj.weight", up[e]
    elif name.endswith(".mlp.experts.down_proj"):
        prefix = name.removesuffix(".down_proj")
        for e in range(tensor.shape[0]):
            yield f"{prefix}.{e}.down_proj.weight", tensor[e]
    elif name.endswith(".self_attn.conv1d.weight"):
        prefix = name.removesuffix(".conv1d.weight")
        for qkv, part in zip("qkv", tensor.chunk(3, dim=0)):
            yield f"{prefix}.{qkv}_conv1d.weight", part
    else:
        yield _rename_to_disk(name), tensor


def read_rows(
    name: str,
    shape: tuple[int, ...],
    start: int,
    stop: int,
    get: Callable[[str, int, int, tuple[int, ...]], torch.Tensor],
) -> torch.Tensor:
    """Rows `[start, stop)` (dim 0) of upstream tensor `name` of full `shape`, from on-disk tensors.

    `get(disk_name, lo, hi, disk_shape)` returns rows `[lo, hi)` of one on-disk tensor whose full
    shape must be `disk_shape`. Only the on-disk tensors (or rows of them) behind the requested rows
    are asked for: the experts `start..stop-1` of a stacked expert tensor, the q/k/v rows under a
    slice of the concatenated conv weight. The inverse of `to_disk_layout`, a slice at a time.
    """
    rest = tuple(shape[1:])
    if name.endswith(".mlp.experts.gate_up_proj"):  # [E, 2I, D] from per-expert [I, D]
        prefix, half = name.removesuffix(".gate_up_proj"), (shape[1] // 2, *shape[2:])
        return torch.stack([
            torch.cat([get(f"{prefix}.{e}.{proj}.weight", 0, half[0], half) for proj in ("gate_proj", "up_proj")])
            for e in range(start, stop)
        ])
    if name.endswith(".mlp.experts.down_proj"):  # [E, D, I] from per-expert [D, I]
        prefix = name.removesuffix(".down_proj")
        return torch.stack([get(f"{prefix}.{e}.down_proj.weight", 0, rest[0], rest) for e in range(start, stop)])
    if name.endswith(".self_attn.conv1d.weight"):  # [3Q, 1, K] from q, k, v [Q, 1, K]
        prefix, q = name.removesuffix(".conv1d.weight"), shape[0] // 3
        parts = [get(f"{prefix}.{qkv}_conv1d.weight", max(start, i * q) - i * q, min(stop, (i + 1) * q) - i * q,
                     (q, *rest))
                 for i, qkv in enumerate("qkv") if max(start, i * q) < min(stop, (i + 1) * q)]
        return torch.cat(parts)
    return get(_rename_to_disk(name), start, stop, tuple(shape))
