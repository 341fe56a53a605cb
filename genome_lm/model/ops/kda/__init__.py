"""Kimi Delta Attention: `chunk` (chunked op), and here upstream's KDA layer
(`Glm5NextTextLinearAttention`) on `chunk_kda`, activations O(T·H·K): `LongKDA`, through `kda_layer_step`
(one layer as a function of the state before a piece), and its context-parallel core.

Upstream, per layer (B batch, T tokens, D model dim, H heads, K = V head dim, W conv width, C3 = 3·H·K):
    qkv  = silu(causal depthwise conv_W([q_proj | k_proj | v_proj](x)))  # [B, T, 3·H·K]
    g    = forget_gate(x)        # log decay in [lower_bound, 0), [B, T, H, K], fp32
    beta = sigmoid(b_proj(x))    # [B, T, H]
    o    = KDA(l2norm(q), l2norm(k), v, g, beta)                          # [B, T, H, V]
    out  = o_proj(o_norm(o, gate=g_b_proj(g_a_proj(x))))                  # [B, T, D]

The conv + SiLU, forget gate and output norm each keep only compute-dtype inputs (`conv.py`,
`chunk.py`, `norm.py`); the gate is applied inside the recurrent op (fla's `use_gate_in_kernel`).

Context parallelism (`LongKDA` with a `cp`): each rank runs its slab; the state crosses slabs.
The gated delta rule is affine in the state it starts from. Over one slab, per head,

    S_out = M · S_in + B              M [K, K], B [K, V]
    o_t   = o^B_t + o^M_t · S_in      o^B_t [V], o^M_t [K] (a row vector)

`chunk_kda` gives both halves: B and o^B from the slab with a zero initial state, M and o^M from the
slab with v replaced by zeros of width K and initial state I. Ranks all-gather (M_r, B_r)
(differentiably), each composes S_in(r) = M_{r-1}(... (M_0 · 0 + B_0) ...) + B_{r-1} and adds
o^M · S_in to its outputs: no rank waits for a chain; about two KDA passes per slab.

The short conv's W-1 pre-conv projections before the slab are recomputed by each rank for its
last W-1 tokens and all-gathered (`LongKDA._cp_forward`; the sequence start is zero-padded).
On fla with equal slabs the core is fla's own context parallelism (the same maps exchanged inside
the kernels, no second pass); the two-pass method runs elsewhere and is its reference."""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from genome_lm.model.cp import CPContext, attach, gather_seq
from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.kda._fla import FLA, FlaKernels, fla_chunk_kda, fla_function, use_fla
from genome_lm.model.ops.kda.chunk import chunk_kda, fla_by_heads, fla_options
from genome_lm.model.ops.kda.conv import KDAShortConv, conv_tail
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.upstream import Glm5NextTextLinearAttention, glm
from genome_lm.settings import DEFAULTS, KDABackend


class LongKDA(LongContextModule, Glm5NextTextLinearAttention):
    """`Glm5NextTextLinearAttention` on `chunk_kda`. Settings: `chunk_size`, `head_block`, `backend`, `fla`
    of `chunk_kda`; `cp` (set by `apply_context_parallel`: the layer runs its rank's slab, below).
    Also installs `KDAShortConv` (upstream only reads `conv1d`'s weight), `KDAForgetGate`, `KDAOutputNorm`.
    """

    chunk_size: int = DEFAULTS.kda_chunk_size
    head_block: int = DEFAULTS.kda_head_block
    backend: KDABackend = DEFAULTS.kda_backend
    fla: FlaKernels = FLA
    cp: CPContext | None = None

    def configure(self, chunk_size: int = DEFAULTS.kda_chunk_size, head_block: int = DEFAULTS.kda_head_block,
                  backend: KDABackend = DEFAULTS.kda_backend, fla: FlaKernels = FLA) -> None:
        if chunk_size < 1:
            raise ValueError(f"kda chunk_size must be >= 1, got {chunk_size}")
        if head_block < 0 or (head_block and self.num_heads % head_block):
            raise ValueError(f"kda head_block={head_block} must be 0 (all heads) or divide the {self.num_heads} heads")
        self.chunk_size, self.head_block = int(chunk_size), int(head_block)
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
        hidden_states = mask_padding(hidden_states, attention_mask)
        if self.cp is not None:
            if cache is not None:
                raise NotImplementedError("context-parallel KDA is for training (no cache); score with one process")
            return self._cp_forward(self.cp, hidden_states)
        if cache is None:
            return kda_layer_step(self, hidden_states)[0]
        return self._cached_forward(hidden_states, cache)

    def _cached_forward(self, hidden_states: torch.Tensor, cache) -> torch.Tensor:
        """Upstream's cache path on `kda_layer_step`: the cache gets the T raw projections (it counts
        them, and keeps them for a `crop`); the states it keeps for its last N tokens run one at a time."""
        idx = self.layer_idx
        T = hidden_states.shape[1]
        recurrent = cache.get_recurrent_state(idx)  # read first: updating the conv state marks the layer started
        mixed = kda_projections(self, hidden_states)  # [B, T, 3·H·K]
        full = cache.update_conv_state(mixed.transpose(1, 2).detach(), idx, conv_kernel_size=self.conv_kernel_size)
        # the W-1 raw projections before the last T columns of `full` [B, C, L] (zeros before the start)
        state = conv_tail(full[..., : full.shape[-1] - T].transpose(1, 2), None, self.conv_kernel_size), recurrent

        keep = min(cache.get_recurrent_states_to_keep(idx), T)
        bounds = ([0] if keep < T else []) + list(range(T - keep, T + 1))  # [0, T-N, T-N+1, ..., T]
        outs, kept = [], []
        for start, end in zip(bounds[:-1], bounds[1:]):
            out, state = kda_layer_step(self, hidden_states[:, start:end], state, mixed=mixed[:, start:end])
            assert state[1] is not None  # the default core, chunk_kda, returns the final state
            final = state[1].detach()
            outs.append(out)
            if start >= T - keep:
                kept.append(final)
        cache.update_recurrent_state(kept if keep else final, idx)
        return torch.cat(outs, dim=1)

    def _cp_forward(self, cp: CPContext, hidden_states: torch.Tensor) -> torch.Tensor:
        """This rank's slab [B, T, D] -> [B, T, D] (`cp` holds the split; the core: `cp_kda_core`)."""
        cp.check_local(hidden_states.shape[1])
        # the W-1 pre-conv projections [B, C3, W-1] before this slab (zeros at sequence start)
        W1 = self.conv_kernel_size - 1
        lengths = [min(W1, n) for n in cp.lengths]
        mixed = kda_projections(self, hidden_states[:, hidden_states.shape[1] - lengths[cp.rank]:])  # [B, <= W-1, C3]
        tails = gather_seq(mixed, lengths, cp.group)  # [B, sum n, C3]: every slab's last tokens, in order
        prefix = conv_tail(tails[:, : sum(lengths[: cp.rank])], None, W1 + 1)  # [B, C3, W-1]
        return kda_layer_step(self, hidden_states, (prefix, None), kda_core=partial(cp_kda_core, cp))[0]


class KDAForgetGate(LongContextModule, glm.Glm5NextTextForgetGate):
    """`Glm5NextTextForgetGate` whose forward(x [B, T, D]) returns the gate's inputs (raw [B, T, H·K],
    A_log [H], dt_bias [H·K]); the gate is `kda_gate(raw.view(B, T, H, K), A_log, dt_bias, lower_bound)`."""

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        raw = self.f_b_proj(self.f_a_proj(hidden_states))  # [B, T, H·K]
        # copies made last: their backward runs first, before FSDP2's post-backward of this module
        return raw, self.A_log.float().clone(), self.dt_bias.float().clone()


# What a KDA layer carries between pieces: (the last pre-conv projections [B, 3·H·K, W-1], the state
# [B, H, K, V] float32 or None: zero in, and no final state out, as fla's context parallelism)
KDAState = tuple[torch.Tensor, torch.Tensor | None]


def kda_layer_step(module: LongKDA, hidden_states: torch.Tensor, state: KDAState | None = None,
                   kda_core: Callable | None = None,
                   mixed: torch.Tensor | None = None) -> tuple[torch.Tensor, KDAState]:
    """A `LongKDA` over the next T >= 1 tokens [B, T, D] after `state` (None: sequence start) -> (out
    [B, T, D], new state); pieces fed in order give one pass's outputs, gradients flow through the
    state. `kda_core` replaces `chunk_kda` (context parallelism); `mixed`: `kda_projections` if known.
    Kept for backward, in the compute dtype: the input, `[q | k | v]` before and after the conv,
    the gate's raw input, beta, the low-rank gate activations, the core's output and the output gate.
    """
    B, T, _ = hidden_states.shape
    head_shape = (B, T, -1, module.head_dim)

    if mixed is None:
        mixed = kda_projections(module, hidden_states)  # [B, T, 3·H·K]
    prev, h0 = (None, None) if state is None else state
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
        initial_state=h0,
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
    return out, (new_conv_state, None if recurrent is None else recurrent.float())


def mask_padding(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Upstream's `apply_mask_to_padding_states`: zero `[B, T, D]` where the `[B, T]` mask is 0."""
    if attention_mask is None:
        return hidden_states
    return (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)


def kda_projections(module: LongKDA, hidden_states: torch.Tensor) -> torch.Tensor:
    """The raw `[q | k | v]` projections that the short conv reads, `[B, T, 3·H·K]`."""
    return torch.cat([module.q_proj(hidden_states), module.k_proj(hidden_states), module.v_proj(hidden_states)], dim=-1)


def cp_kda_core(cp, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                chunk_size: int = 64, use_qk_l2norm_in_kernel: bool = False, head_block: int = 0,
                backend: KDABackend = DEFAULTS.kda_backend, fla: FlaKernels = FLA, **gate):
    """`chunk_kda`'s contract for this rank's slab of a sequence split over the CP group `cp`."""
    if initial_state is not None:
        raise NotImplementedError("context-parallel KDA starts every sequence from a zero state")
    if use_fla(q.device.type, backend, fla) and len(set(cp.lengths)) == 1:
        # fla's own CP (equal slabs; each batch row its own sequence of cp·T tokens): no final state
        build = fla_function("fla.ops.cp", "build_cp_context", fla)
        bounds = torch.tensor([0, q.shape[1] * cp.size], dtype=torch.long)
        group = cp.group if cp.group is not None else torch.distributed.group.WORLD  # None: the default group
        context = build(bounds.to(q.device), group=group, cu_seqlens_cpu=bounds)
        gate, kw = fla_options(gate, chunk_size, scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                               cp_context=context)
        outs = [fla_by_heads(fla_chunk_kda(fla), head_block, q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1],
                             beta[b:b + 1], gate, **kw)[0] for b in range(q.shape[0])]
        return torch.cat(outs).to(q.dtype), None
    kw = dict(scale=scale, output_final_state=True, chunk_size=chunk_size,
              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, head_block=head_block, backend=backend, fla=fla, **gate)
    Bsz, T, HV, V = v.shape
    K = q.shape[-1]
    o_b, B_r = chunk_kda(q, k, v, g, beta, **kw)  # [B, T, HV, V], [B, HV, K, V]
    eye = torch.eye(K, dtype=torch.float32, device=q.device).expand(Bsz, HV, K, K)
    # [B, T, HV, K], [B, HV, K, K]
    o_m, M_r = chunk_kda(q, k, v.new_zeros(Bsz, T, HV, K), g, beta, initial_state=eye, **kw)
    assert B_r is not None and M_r is not None  # output_final_state=True
    mine = torch.cat([M_r.float(), B_r.float()], dim=-1)[:, None]  # [B, 1, HV, K, K + V]
    maps = gather_seq(mine, [1] * cp.size, cp.group)  # [B, R, HV, K, K + V]
    s_in = maps.new_zeros(Bsz, HV, K, V)  # the state entering this rank, [B, HV, K, V] float32
    for j in range(cp.rank):
        s_in = torch.matmul(maps[:, j, ..., :K], s_in) + maps[:, j, ..., K:]  # M_j · S + B_j
    s_in = attach(s_in, maps)  # rank 0 uses no map, but must still run the gather's backward
    o = o_b.float() + torch.einsum("bthk,bhkv->bthv", o_m.float(), s_in)
    final = torch.matmul(M_r.float(), s_in) + B_r.float()
    return o.to(q.dtype), final
