"""Chunked Kimi Delta Attention (gated delta rule with per-channel decay) in pure torch.

Semantics are those of fla's `naive_recurrent_kda`, one token at a time; per value head, with state S
in R^{K x V}:

    S_t = diag(exp(g_t)) S_{t-1}                      (per-channel decay, g in log space)
    S_t = S_t + beta_t k_t (v_t - S_t^T k_t)^T        (delta rule)
    o_t = S_t^T (scale * q_t)

The sequence is cut into chunks of C tokens; within a chunk the delta rule is solved in WY form, across
chunks a [K, V] state is carried. With Γ_t = Σ_{u<=t} g_u the in-chunk cumulative log-decay ([C, K]):

    A_kk[t, s] = Σ_d k_t[d] k_s[d] exp(Γ_t[d] - Γ_s[d])   (s < t)
    A_qk[t, s] = Σ_d q_t[d] k_s[d] exp(Γ_t[d] - Γ_s[d])   (s <= t)
    δ   = (I + diag(β) A_kk)^{-1} diag(β) (v - (k ⊙ e^Γ) S)  =  u - w S
    o   = (q ⊙ e^Γ) S + A_qk δ
    S'  = e^{Γ_C} ⊙ S + (k ⊙ e^{Γ_C - Γ})^T δ

Memory: the [C, C, K] decay tensor of upstream's fallback is never built; A is plain [C, C]
matmuls of decay-rescaled q/k. Segments of 16 chunks are recomputed in backward: what stays alive
is the inputs, the output and one [K, V] state per segment, O(T·H·(K + V)); with
`use_gate_in_kernel` each segment applies the gate (`kda_gate`), so raw g is kept.

Stability: exp() is only taken of non-positive numbers (g <= 0), so nothing overflows for any
decay strength (for A: the binary split of `_lower_scores`). Underflow only hits products whose
true value is below fp32's range too.

The forget gate, upstream's `Glm5NextTextForgetGate` (the reference) on raw = f_b_proj(f_a_proj(x)) [B, T, H·K],
float32 [B, T, H, K], keeping three float32 tensors; here the KDA op applies it (`kda_gate`, token blocks, as
fla's `use_gate_in_kernel`), so only raw stays for backward:

    g = lower_bound · sigmoid(exp(A_log) · (raw + dt_bias))      (GLM-5.3-Flash: lower_bound -5)
    g = -exp(A_log) · softplus(raw + dt_bias)                   (lower_bound None)
"""

from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from genome_lm.model.ops.kda._fla import FLA, FlaKernels, fla_chunk_kda, use_fla
from genome_lm.model.ops.norm import row_blocks
from genome_lm.settings import DEFAULTS, KDABackend

ROW_BLOCK = 4096  # tokens per block of the forget gate's float32 temporaries


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(Σ x² + eps)`: fla's (and upstream transformers') qk normalisation."""
    return x / torch.sqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              scale: float | None = None, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
              chunk_size: int = 64, use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              A_log: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
              head_block: int = 0, backend: KDABackend = DEFAULTS.kda_backend,
              fla: FlaKernels = FLA, segment_chunks: int = 16) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked KDA, arguments as `fla.ops.kda.chunk_kda`: q, k [B, T, H, K], v [B, T, HV, V] (GVA:
    value head h reads q/k head h // (HV / H)), g [B, T, HV, K] log decay (<= 0), beta [B, T, HV],
    initial_state [B, HV, K, V] -> (o [B, T, HV, V] in q's dtype, final state float32 or None).

    `use_gate_in_kernel`: g is the gate's raw input, applied as `gate.kda_gate(g, A_log [HV],
    dt_bias [HV·K], lower_bound)`. `head_block` (fla only): value heads per kernel call
    (`fla_by_heads`). `backend` (`_fla.use_fla`): fla's kernel (of `fla`) or the torch path (fp32,
    differentiable w.r.t. every tensor argument, `initial_state` included), in checkpointed segments of
    `segment_chunks * chunk_size` tokens (~20 floats per token, head and channel while one runs);
    short T shrinks the chunk.
    """
    if use_fla(q.device.type, backend, fla):
        gate = dict(use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)
        gate, kw = fla_options(gate, chunk_size, scale=scale, output_final_state=output_final_state,
                               use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        h0 = None if initial_state is None else initial_state.float()  # fla asserts fp32
        o, S = fla_by_heads(fla_chunk_kda(fla), head_block, q, k, v, g, beta, gate, initial_state=h0, **kw)
        return o.to(q.dtype), (S.float() if S is not None else None)
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two, got {chunk_size}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"value heads ({HV}) must be a multiple of query/key heads ({H})")
    segment = partial(_kda_segment, scale=K**-0.5 if scale is None else scale, chunk_size=chunk_size,
                      l2norm_qk=use_qk_l2norm_in_kernel, gate_in_kernel=use_gate_in_kernel, lower_bound=lower_bound)
    gate_params = (A_log, dt_bias) if use_gate_in_kernel else (None, None)
    S = q.new_zeros(B, HV, K, V, dtype=torch.float32) if initial_state is None else initial_state.float()
    if T == 0:
        return v.new_zeros(B, 0, HV, V, dtype=q.dtype), (S if output_final_state else None)

    recompute = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, g, beta, initial_state, *gate_params)
    )
    step = segment_chunks * chunk_size
    outs = []
    # split (not slicing): its backward concatenates the pieces' grads once, O(T) in total
    for q_i, k_i, v_i, g_i, beta_i in zip(*(x.split(step, dim=1) for x in (q, k, v, g, beta))):
        if recompute:
            o, S = checkpoint(segment, q_i, k_i, v_i, g_i, beta_i, S, *gate_params, use_reentrant=False)
        else:
            o, S = segment(q_i, k_i, v_i, g_i, beta_i, S, *gate_params)
        outs.append(o)
    o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [B, T, HV, V]
    return o, (S if output_final_state else None)


chunk_kda_torch = partial(chunk_kda, backend="torch")  # the torch path on any device


def fla_options(gate: dict, chunk_size: int, **kw) -> tuple[dict, dict]:
    """(gate, kw) for fla's `chunk_kda`, new dicts: `safe_gate` (fla's fast path, bounds in [-5, 0)
    only) added for an in-kernel gate, a chunk size fla takes (32 or 64)."""
    if gate.get("use_gate_in_kernel"):
        bound = gate.get("lower_bound")
        gate = dict(gate, safe_gate=bound is not None and -5 <= bound < 0)
    return dict(gate), dict(kw, chunk_size=chunk_size if chunk_size in (32, 64) else 64)


def fla_by_heads(fla_fn, head_block: int, q, k, v, g, beta, gate: dict, initial_state=None, **kw):
    """`fla_fn` (fla's `chunk_kda` contract) over groups of `head_block` value heads (0 or >= HV: one
    call), so fla's backward rebuilds its chunk transients for that many heads at a time; outputs
    [B, T, HV, V] and final states [B, HV, K, V] concatenated over the groups."""
    HV, H, K = v.shape[2], q.shape[2], q.shape[3]
    if not head_block or head_block >= HV:
        return fla_fn(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, **gate, **kw)
    G = HV // H
    if head_block % G or HV % head_block:
        raise ValueError(f"kda head_block={head_block} must divide the {HV} value heads in multiples of {G}")
    outs, states = [], []
    for h0 in range(0, HV, head_block):
        h1, hq = h0 + head_block, slice(h0 // G, (h0 + head_block) // G)
        part = dict(gate)
        for name, rows in (("A_log", 1), ("dt_bias", K)):
            if part.get(name) is not None:
                part[name] = part[name][h0 * rows:h1 * rows]
        o, S = fla_fn(q=q[:, :, hq], k=k[:, :, hq], v=v[:, :, h0:h1], g=g[:, :, h0:h1], beta=beta[:, :, h0:h1],
                      initial_state=None if initial_state is None else initial_state[:, h0:h1], **part, **kw)
        outs.append(o)
        states.append(S)
    return torch.cat(outs, dim=2), (None if states[0] is None else torch.cat(states, dim=1))


def _kda_segment(q, k, v, g, beta, S, A_log, dt_bias, scale: float, chunk_size: int, l2norm_qk: bool,
                 gate_in_kernel: bool, lower_bound: float | None):
    """KDA over one segment: `[B, T, H, K]`-shaped inputs, `S` `[B, HV, K, V]` fp32 -> (o, S)."""
    dtype = q.dtype
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if gate_in_kernel:
        g = kda_gate(g, A_log, dt_bias, lower_bound)  # [B, T, HV, K] float32
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if l2norm_qk:
        q, k = l2norm(q), l2norm(k)
    q = q * scale
    if HV > H:  # GVA: value head h reads q/k head h // (HV / H)
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)  # [B, T, HV, K]

    C = min(chunk_size, 1 << (T - 1).bit_length())  # short sequences: one small chunk
    N = -(-T // C)
    pad = N * C - T  # padded steps: g=0, k=0, beta=0 leave the state unchanged

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, HV, D] -> [N, B, HV, C, D]
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        return x.view(B, N, C, HV, -1).permute(1, 0, 3, 2, 4).contiguous()

    q, k, v, beta = (chunks(x) for x in (q, k, v, beta[..., None]))
    gc = chunks(g).cumsum(-2)  # Γ: in-chunk cumulative log decay, [N, B, HV, C, K]
    # A_xk[t, s] = Σ_d x_t[d] k_s[d] exp(gc_t[d] - gc_s[d]): A_qk (s <= t), A_kk (s < t), [N, B, HV, C, C] each
    A_qk, A_kk = _lower_scores(torch.stack([q, k]), k, gc).unbind(0)
    A_kk = A_kk.tril(-1)

    # WY form: (I + diag(β) A_kk) [u | w] = diag(β) [v | k ⊙ e^Γ]
    decay_in = gc.exp()  # decay from chunk start, [N, B, HV, C, K]
    L = beta * A_kk + torch.eye(C, device=q.device)  # unit lower triangular, [N, B, HV, C, C]
    rhs = beta * torch.cat([v, k * decay_in], dim=-1)  # [N, B, HV, C, V + K]
    u, w = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True).split([V, K], dim=-1)

    q_in = q * decay_in  # queries seeing the chunk-start state, [N, B, HV, C, K]
    k_out = k * (gc[..., -1:, :] - gc).exp()  # keys decayed to chunk end, [N, B, HV, C, K]
    decay = gc[..., -1, :, None].exp()  # whole-chunk decay, [N, B, HV, K, 1]

    outs = []
    for n in range(N):
        delta = u[n] - w[n] @ S  # [B, HV, C, V]
        outs.append(q_in[n] @ S + A_qk[n] @ delta)
        S = S * decay[n] + k_out[n].transpose(-1, -2) @ delta  # [B, HV, K, V]
    o = torch.stack(outs).permute(1, 0, 3, 2, 4).reshape(B, N * C, HV, V)[:, :T]  # [B, T, HV, V]
    return o.to(dtype), S


def _lower_scores(x: torch.Tensor, y: torch.Tensor, gc: torch.Tensor) -> torch.Tensor:
    """`out[..., t, s] = Σ_d x_t y_s exp(gc_t - gc_s)` for s <= t, zero above; x `[2, ..., L, K]`.

    Binary split: [[D0, 0], [X1 Y0^T, D1]]. The cross block uses Γ at the first token of the
    second half as reference r, so exp(Γ_t - Γ_r) <= 1 (t >= r) and exp(Γ_r - Γ_s) <= 1 (s < r).
    """
    L = x.shape[-2]
    if L == 1:
        return (x * y).sum(-1, keepdim=True)  # [2, ..., 1, 1]
    h = L // 2
    x2, y2, g2 = x.unflatten(-2, (2, h)), y.unflatten(-2, (2, h)), gc.unflatten(-2, (2, h))  # [.., 2, h, K]
    diag = _lower_scores(x2, y2, g2)  # [2, ..., 2, h, h]
    ref = g2[..., 1, :1, :]  # Γ at the first token of the second half, [..., 1, K]
    x1 = x2[..., 1, :, :] * (g2[..., 1, :, :] - ref).exp()  # [2, ..., h, K]
    y0 = y2[..., 0, :, :] * (ref - g2[..., 0, :, :]).exp()  # [..., h, K]
    cross = x1 @ y0.transpose(-1, -2)  # [2, ..., h, h]
    top = torch.cat([diag[..., 0, :, :], torch.zeros_like(cross)], dim=-1)
    bottom = torch.cat([cross, diag[..., 1, :, :]], dim=-1)
    return torch.cat([top, bottom], dim=-2)  # [2, ..., L, L]


def _softplus(g: torch.Tensor) -> torch.Tensor:
    return torch.where(g > 20.0, g, torch.log(1.0 + torch.exp(g)))  # upstream's, exactly


class KDAGateFunction(torch.autograd.Function):
    """raw [N, H, K] (any float dtype), A_log [H], dt_bias [H·K] -> g [N, H, K] float32."""

    @staticmethod
    def forward(ctx, raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None):
        H, K = raw.shape[-2:]
        rate, bias = A_log.float().exp().view(H, 1), dt_bias.float().view(H, K)
        out = torch.empty(raw.shape, dtype=torch.float32, device=raw.device)
        for a, b in row_blocks(raw.shape[0], ROW_BLOCK):
            g = raw[a:b].float() + bias
            out[a:b] = lower_bound * torch.sigmoid(rate * g) if lower_bound is not None else -rate * _softplus(g)
        ctx.save_for_backward(raw, A_log, dt_bias)
        ctx.lower_bound = lower_bound
        return out

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        raw, A_log, dt_bias = ctx.saved_tensors
        H, K = raw.shape[-2:]
        lb = ctx.lower_bound
        rate, bias = A_log.float().exp().view(H, 1), dt_bias.float().view(H, K)
        draw = torch.empty(raw.shape, dtype=raw.dtype, device=raw.device)
        d_rate = torch.zeros(H, 1, dtype=torch.float32, device=raw.device)
        d_bias = torch.zeros(H, K, dtype=torch.float32, device=raw.device)
        for a, b in row_blocks(raw.shape[0], ROW_BLOCK):
            g, d = raw[a:b].float() + bias, dy[a:b].float()
            if lb is not None:
                s = torch.sigmoid(rate * g)
                dz = d * (lb * s * (1 - s))  # d (rate · g)
                d_rate += (dz * g).sum((0, 2))[:, None]
                dg = dz * rate
            else:
                d_rate -= (d * _softplus(g)).sum((0, 2))[:, None]
                dg = -rate * d * torch.where(g > 20.0, torch.ones_like(g), torch.sigmoid(g))
            d_bias += dg.sum(0)
            draw[a:b] = dg.to(raw.dtype)
        d_A = (d_rate[:, 0] * rate[:, 0]).to(A_log.dtype)  # d exp(A_log) / d A_log = exp(A_log)
        return draw, d_A, d_bias.view_as(dt_bias).to(dt_bias.dtype), None


def kda_gate(raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
             lower_bound: float | None = None) -> torch.Tensor:
    """raw `[..., H, K]`, A_log `[H]`, dt_bias `[H·K]` -> `Glm5NextTextForgetGate.forward`'s `[..., H, K]` float32."""
    shape = raw.shape
    return KDAGateFunction.apply(raw.reshape(-1, *shape[-2:]), A_log, dt_bias, lower_bound).view(shape)
