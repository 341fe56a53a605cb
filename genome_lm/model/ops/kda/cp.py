"""Context-parallel KDA (`LongKDA` with a `cp`): each rank runs its slab; the state crosses slabs.
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
the kernels, no second pass); the two-pass method runs elsewhere and is its reference.
Shapes: B batch, T slab tokens, H heads, K = V head dims, C3 = 3·H·K, W conv width.
"""

from __future__ import annotations

import torch

from genome_lm.model.cp import attach, gather_seq
from genome_lm.model.ops.kda._fla import FLA, FlaKernels, fla_chunk_kda, fla_function, use_fla
from genome_lm.model.ops.kda.chunk import chunk_kda, fla_by_heads, fla_options
from genome_lm.settings import DEFAULTS, KDABackend


def cp_kda_core(cp, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                chunk_size: int = 64, use_qk_l2norm_in_kernel: bool = False, head_block: int = 0,
                backend: KDABackend = DEFAULTS.kda_backend, fla: FlaKernels = FLA, **gate):
    """`chunk_kda`'s contract for this rank's slab of a sequence split over the CP group `cp`."""
    if initial_state is not None:
        raise NotImplementedError("context-parallel KDA starts every sequence from a zero state")
    if use_fla(q.device.type, backend, fla) and len(set(cp.lengths)) == 1:
        return fla_cp_kda_core(cp, q, k, v, g, beta, scale, chunk_size, use_qk_l2norm_in_kernel, head_block, fla,
                               **gate)
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


def fla_cp_kda_core(cp, q, k, v, g, beta, scale, chunk_size: int, use_qk_l2norm_in_kernel: bool, head_block: int,
                    fla: FlaKernels = FLA, **gate):
    """fla's context-parallel `chunk_kda` on this rank's slab (equal slabs; each batch row its own
    sequence of cp·T tokens) -> (o [B, T, HV, V], None): fla's CP gives no final state."""
    build = fla_function("fla.ops.cp", "build_cp_context", fla)
    T = q.shape[1]
    bounds = torch.tensor([0, T * cp.size], dtype=torch.long)
    group = cp.group if cp.group is not None else torch.distributed.group.WORLD  # None: the default group
    context = build(bounds.to(q.device), group=group, cu_seqlens_cpu=bounds)
    gate, kw = fla_options(gate, chunk_size, scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                           cp_context=context)
    outs = [fla_by_heads(fla_chunk_kda(fla), head_block, q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1],
                         beta[b:b + 1], gate, **kw)[0] for b in range(q.shape[0])]
    return torch.cat(outs).to(q.dtype), None
