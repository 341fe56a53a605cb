"""One KDA layer as a function of the state before a piece: `kda_layer_step` and `KDAState`, called by
`LongKDA` (training, its `Cache` path) and the context-parallel slab path (`cp.py`).

Shapes: B batch, T tokens, D model dim, H heads, K = V head dim, W conv width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from genome_lm.model.cp import CPContext
from genome_lm.model.ops.kda._fla import FlaKernels
from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.conv import KDAShortConv, conv_tail
from genome_lm.model.ops.kda.gate import KDAForgetGate
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.settings import KDABackend


class KDAModule(Protocol):
    """What a KDA step reads of its layer (`layer.LongKDA`)."""

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    b_proj: nn.Linear
    g_a_proj: nn.Linear
    g_b_proj: nn.Linear
    o_proj: nn.Linear
    head_dim: int
    qkv_dim: int
    conv_kernel_size: int
    conv1d: KDAShortConv
    forget_gate: KDAForgetGate
    o_norm: KDAOutputNorm
    chunk_size: int
    head_block: int
    backend: KDABackend
    fla: FlaKernels
    cp: CPContext | None

KDACore = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
"""A recurrent core called like `chunk_kda`: `(o, final state or None)`."""


@dataclass
class KDAState:
    """What one KDA layer carries from one piece of a sequence to the next: `conv_state` [B, 3·H·K, W-1]
    the last pre-conv projections; `recurrent_state` [B, H, K, V] float32, None for a zero state (in)
    or from a core that gives no final state (out: fla's context parallelism)."""

    conv_state: torch.Tensor
    recurrent_state: torch.Tensor | None

    def detach(self) -> KDAState:
        recurrent = None if self.recurrent_state is None else self.recurrent_state.detach()
        return KDAState(self.conv_state.detach(), recurrent)


def kda_layer_step(module: KDAModule, hidden_states: torch.Tensor, state: KDAState | None = None,
                   attention_mask: torch.Tensor | None = None, chunk_size: int | None = None,
                   kda_core: KDACore | None = None, mixed: torch.Tensor | None = None) -> tuple[torch.Tensor, KDAState]:
    """A `LongKDA` over the next T >= 1 tokens [B, T, D], given the `KDAState` after the tokens before
    them (None: sequence start) -> (out [B, T, D], new state). Feeding pieces in order gives one
    pass's outputs; purely functional, so gradients flow through the carried state. `kda_core`
    replaces `chunk_kda` (context parallelism); `mixed`: `kda_projections`, if already computed.

    Kept for backward, in the compute dtype: the input, `[q | k | v]` before and after the conv,
    the gate's raw input, beta, the low-rank gate activations, the core's output and the output gate.
    """
    if not isinstance(module.conv1d, KDAShortConv):
        raise TypeError(f"kda_layer_step runs a LongKDA, got {type(module).__name__}: LongKDA.install(module) first")
    if chunk_size is None:
        chunk_size = module.chunk_size
    hidden_states = mask_padding(hidden_states, attention_mask)
    B, T, _ = hidden_states.shape
    head_shape = (B, T, -1, module.head_dim)

    if mixed is None:
        mixed = kda_projections(module, hidden_states)  # [B, T, 3·H·K]
    prev = None if state is None else state.conv_state  # [B, 3·H·K, W-1]
    # called as a module, so that a sharded conv1d (float32) is gathered
    qkv = module.conv1d(mixed, prev)  # silu(causal depthwise conv), [B, T, 3·H·K]
    new_conv_state = conv_tail(mixed, prev, module.conv_kernel_size)  # [B, 3·H·K, W-1]

    query, key, value = qkv.split([module.qkv_dim] * 3, dim=-1)
    query, key, value = query.view(head_shape), key.view(head_shape), value.view(head_shape)  # [B, T, H, K]
    raw_gate, A_log, dt_bias = module.forget_gate(hidden_states)  # the gate's inputs; the core applies it
    beta = torch.sigmoid(module.b_proj(hidden_states))  # [B, T, H]

    core, recurrent = (kda_core or chunk_kda)(
        query,
        key,
        value,
        raw_gate.view(head_shape),
        beta,
        initial_state=None if state is None else state.recurrent_state,
        output_final_state=True,
        chunk_size=chunk_size,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        A_log=A_log,
        dt_bias=dt_bias,
        lower_bound=module.forget_gate.safe_gate_lower_bound,
        head_block=module.head_block,
        backend=module.backend,
        fla=module.fla,
    )  # core [B, T, H, V]

    gate = module.g_b_proj(module.g_a_proj(hidden_states)).view(head_shape)
    out = module.o_proj(module.o_norm(core, gate).reshape(B, T, -1))  # [B, T, D]
    return out, KDAState(new_conv_state, None if recurrent is None else recurrent.float())


def mask_padding(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Upstream's `apply_mask_to_padding_states`: zero the `[B, T, D]` input where the `[B, T]` mask is 0."""
    if attention_mask is None:
        return hidden_states
    return (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)


def kda_projections(module: KDAModule, hidden_states: torch.Tensor) -> torch.Tensor:
    """The raw `[q | k | v]` projections that the short conv reads, `[B, T, 3·H·K]`."""
    return torch.cat([module.q_proj(hidden_states), module.k_proj(hidden_states), module.v_proj(hidden_states)], dim=-1)


def conv_state_before(full: torch.Tensor, T: int, width: int) -> torch.Tensor:
    """The W-1 raw projections [B, C, W-1] before the last T columns of `full` [B, C, L], what
    `Cache.update_conv_state` returns; fewer than W-1 cached columns are zero-padded on the left."""

    before = full[..., : full.shape[-1] - T][..., -(width - 1):]
    missing = width - 1 - before.shape[-1]
    return F.pad(before, (missing, 0)) if missing else before
