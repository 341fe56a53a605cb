"""Upstream's KDA layer (`Glm5NextTextLinearAttention`) on `chunk_kda`, activations O(T·H·K): `LongKDA`,
through `kda_layer_step` (one layer as a function of the `KDAState` before a piece).

Upstream, per layer (B batch, T tokens, D model dim, H heads, K = V head dim, W conv width):
    qkv  = silu(causal depthwise conv_W([q_proj | k_proj | v_proj](x)))  # [B, T, 3·H·K]
    g    = forget_gate(x)        # log decay in [lower_bound, 0), [B, T, H, K], fp32
    beta = sigmoid(b_proj(x))    # [B, T, H]
    o    = KDA(l2norm(q), l2norm(k), v, g, beta)                          # [B, T, H, V]
    out  = o_proj(o_norm(o, gate=g_b_proj(g_a_proj(x))))                  # [B, T, D]

The conv + SiLU, forget gate and output norm each keep only compute-dtype inputs (`conv.py`,
`gate.py`, `norm.py`); the gate is applied inside the recurrent op (fla's `use_gate_in_kernel`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from genome_lm.model.cp import CPContext, gather_seq
from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.kda._fla import FLA, FlaKernels
from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.conv import KDAShortConv, conv_tail
from genome_lm.model.ops.kda.cp import cp_kda_core
from genome_lm.model.ops.kda.gate import KDAForgetGate
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.upstream import Glm5NextTextLinearAttention
from genome_lm.settings import DEFAULTS, KDABackend


class LongKDA(LongContextModule, Glm5NextTextLinearAttention):
    """`Glm5NextTextLinearAttention` on `chunk_kda`. Settings: `chunk_size`, `head_block`, `backend`, `fla`
    of `chunk_kda`; `cp` (set by `apply_context_parallel`: the layer runs its rank's slab, `cp.py`).
    Also installs `KDAShortConv` (upstream only reads `conv1d`'s weight), `KDAForgetGate`, `KDAOutputNorm`.
    """

    upstream = Glm5NextTextLinearAttention
    chunk_size: int = DEFAULTS.kda_chunk_size
    head_block: int = DEFAULTS.kda_head_block
    backend: KDABackend = DEFAULTS.kda_backend
    fla: FlaKernels = FLA
    cp: CPContext | None = None
    # the parts `configure` installs
    conv1d: KDAShortConv
    forget_gate: KDAForgetGate
    o_norm: KDAOutputNorm

    def configure(self, chunk_size: int = DEFAULTS.kda_chunk_size, head_block: int = DEFAULTS.kda_head_block,
                  backend: KDABackend = DEFAULTS.kda_backend, fla: FlaKernels = FLA) -> None:
        if chunk_size < 1:
            raise ValueError(f"kda chunk_size must be >= 1, got {chunk_size}")
        if head_block < 0 or (head_block and self.num_heads % head_block):
            raise ValueError(f"kda head_block={head_block} must be 0 (all heads) or divide the {self.num_heads} heads")
        self.chunk_size = int(chunk_size)
        self.head_block = int(head_block)
        self.backend, self.fla = backend, fla
        KDAShortConv.install(self.conv1d, activation=self.activation, backend=backend, fla=fla)
        KDAForgetGate.install(self.forget_gate)
        KDAOutputNorm.install(self.o_norm, backend=backend, fla=fla)

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}, head_block={self.head_block}, cp={self.cp}"

    def forward(self, hidden_states: torch.Tensor, cache=None, attention_mask: torch.Tensor | None = None,
                **kwargs) -> torch.Tensor:
        """Upstream's call: hidden_states [B, T, D] -> [B, T, D], `cache` updated as upstream does."""
        if kwargs.get("cu_seqlens") is not None or kwargs.get("seq_idx") is not None:
            raise NotImplementedError("genome_lm's KDA does not support packed sequences (cu_seqlens / seq_idx)")
        if self.cp is not None:
            if cache is not None:
                raise NotImplementedError("context-parallel KDA is for training (no cache); score with one process")
            return self._cp_forward(self.cp, hidden_states, attention_mask)
        if cache is None:
            return kda_layer_step(self, hidden_states, None, attention_mask)[0]
        return self._cached_forward(hidden_states, cache, attention_mask)

    def _cached_forward(self, hidden_states: torch.Tensor, cache, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Upstream's cache path on `kda_layer_step`: the cache gets the T raw projections (it counts
        them, and keeps them for a `crop`); the states it keeps for its last N tokens run one at a time."""
        idx = self.layer_idx
        hidden_states = mask_padding(hidden_states, attention_mask)
        B, T, _ = hidden_states.shape
        recurrent = cache.get_recurrent_state(idx)  # read first: updating the conv state marks the layer started
        mixed = kda_projections(self, hidden_states)  # [B, T, 3·H·K]
        full = cache.update_conv_state(mixed.transpose(1, 2).detach(), idx, conv_kernel_size=self.conv_kernel_size)
        if recurrent is None:
            recurrent = mixed.new_zeros(B, self.num_heads, self.head_dim, self.head_dim, dtype=torch.float32)
        # the W-1 raw projections before the last T columns of `full` [B, C, L], fewer zero-padded on the left
        before = full[..., : full.shape[-1] - T][..., -(self.conv_kernel_size - 1):]
        missing = self.conv_kernel_size - 1 - before.shape[-1]
        state = KDAState(F.pad(before, (missing, 0)) if missing else before, recurrent)

        keep = min(cache.get_recurrent_states_to_keep(idx), T)
        bounds = ([0] if keep < T else []) + list(range(T - keep, T + 1))  # [0, T-N, T-N+1, ..., T]
        outs, kept = [], []
        for start, end in zip(bounds[:-1], bounds[1:]):
            out, state = kda_layer_step(self, hidden_states[:, start:end], state, mixed=mixed[:, start:end])
            assert state.recurrent_state is not None  # the default core, chunk_kda, returns the final state
            final = state.recurrent_state.detach()
            outs.append(out)
            if start >= T - keep:
                kept.append(final)
        cache.update_recurrent_state(kept if keep else final, idx)
        return torch.cat(outs, dim=1)

    def _cp_forward(self, cp: CPContext, hidden_states: torch.Tensor,
                    attention_mask: torch.Tensor | None) -> torch.Tensor:
        """This rank's slab [B, T, D] -> [B, T, D] (`cp` holds the split; the core: `cp.cp_kda_core`)."""
        cp.check_local(hidden_states.shape[1])
        hidden_states = mask_padding(hidden_states, attention_mask)
        # the W-1 pre-conv projections [B, C3, W-1] before this slab (zeros at sequence start)
        W1 = self.conv_kernel_size - 1
        lengths = [min(W1, n) for n in cp.lengths]
        mixed = kda_projections(self, hidden_states[:, hidden_states.shape[1] - lengths[cp.rank]:])  # [B, <= W-1, C3]
        tails = gather_seq(mixed, lengths, cp.group)  # [B, sum n, C3]: every slab's last tokens, in order
        padded = torch.cat([tails.new_zeros(tails.shape[0], W1, tails.shape[2]), tails], dim=1)
        before = sum(lengths[: cp.rank])  # tails rows before this slab
        prefix = padded[:, before : before + W1].transpose(1, 2)  # [B, C3, W-1]
        core = lambda *a, **kw: cp_kda_core(cp, *a, **kw)  # noqa: E731
        out, _ = kda_layer_step(self, hidden_states, KDAState(prefix, None), None, kda_core=core)
        return out


@dataclass
class KDAState:
    """What a KDA layer carries between pieces: the last pre-conv projections [B, 3·H·K, W-1] and the
    state [B, H, K, V] float32 (None: zero in; no final state out, as fla's context parallelism)."""

    conv_state: torch.Tensor
    recurrent_state: torch.Tensor | None


def kda_layer_step(module: LongKDA, hidden_states: torch.Tensor, state: KDAState | None = None,
                   attention_mask: torch.Tensor | None = None, kda_core: Callable | None = None,
                   mixed: torch.Tensor | None = None) -> tuple[torch.Tensor, KDAState]:
    """A `LongKDA` over the next T >= 1 tokens [B, T, D] after `state` (None: sequence start) -> (out
    [B, T, D], new state); pieces fed in order give one pass's outputs, gradients flow through the
    state. `kda_core` replaces `chunk_kda` (context parallelism); `mixed`: `kda_projections` if known.
    Kept for backward, in the compute dtype: the input, `[q | k | v]` before and after the conv,
    the gate's raw input, beta, the low-rank gate activations, the core's output and the output gate.
    """
    if not isinstance(module.conv1d, KDAShortConv):
        raise TypeError(f"kda_layer_step runs a LongKDA, got {type(module).__name__}: LongKDA.install(module) first")
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
        chunk_size=module.chunk_size,
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
    """Upstream's `apply_mask_to_padding_states`: zero `[B, T, D]` where the `[B, T]` mask is 0."""
    if attention_mask is None:
        return hidden_states
    return (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)


def kda_projections(module: LongKDA, hidden_states: torch.Tensor) -> torch.Tensor:
    """The raw `[q | k | v]` projections that the short conv reads, `[B, T, 3·H·K]`."""
    return torch.cat([module.q_proj(hidden_states), module.k_proj(hidden_states), module.v_proj(hidden_states)], dim=-1)
