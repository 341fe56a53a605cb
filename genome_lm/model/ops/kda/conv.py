"""KDA's short causal conv + SiLU keeping only its input. Upstream convolves `[q | k | v]` (x [B, T, C],
C = 3·H·K) depthwise over W tokens with the float32 weight [C, 1, W], SiLU in float32, keeping the
float32 copies (reference: `naive_short_conv`, below). `short_conv` keeps x and `prev` (the W-1
projections before x): fla's `causal_conv1d` on CUDA, else `ShortConvFunction` (token blocks,
recomputed in backward). `KDAShortConv` is upstream's `conv1d` on it, so FSDP2 gathers its weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.kda._fla import FLA, FlaKernels, fla_causal_conv1d, use_fla
from genome_lm.model.ops.norm import row_blocks
from genome_lm.settings import DEFAULTS, KDABackend

BLOCK_TOKENS = 2048


def _prev(prev: torch.Tensor | None, x: torch.Tensor, W: int) -> torch.Tensor:
    """The W-1 projections before x [B, T, C], [B, C, W-1] in x's dtype (zeros at the sequence start)."""
    return x.new_zeros(x.shape[0], x.shape[2], W - 1) if prev is None else prev.to(x.dtype)


def _window(x: torch.Tensor, prev_rows: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Rows [a - (W-1), b) of [prev | x] (the inputs of outputs a..b-1), [B, b - a + W-1, C]."""
    lo = a - prev_rows.shape[1]
    if lo >= 0:
        return x[:, lo:b]
    return torch.cat([prev_rows[:, prev_rows.shape[1] + lo:], x[:, :b]], dim=1)


def _conv(window: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(window in the weight's dtype [B, C, n + W-1], the valid depthwise conv of it [B, C, n])."""
    xw = window.transpose(1, 2).to(weight.dtype, memory_format=torch.contiguous_format)
    return xw, F.conv1d(xw, weight, groups=weight.shape[0])


class ShortConvFunction(torch.autograd.Function):
    """silu(depthwise causal conv) in the weight's dtype, cast to x's; saves x, weight and prev."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, prev: torch.Tensor | None, block_tokens: int):
        rows = _prev(prev, x, weight.shape[-1]).transpose(1, 2)  # [B, W-1, C]
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [B, T, C]
        for a, b in row_blocks(x.shape[1], block_tokens):
            _, z = _conv(_window(x, rows, a, b), weight)
            out[:, a:b] = F.silu(z).to(x.dtype).transpose(1, 2)
        ctx.save_for_backward(x, weight, prev)
        ctx.block_tokens = block_tokens
        return out

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, prev = ctx.saved_tensors
        B, T, C = x.shape
        W1 = weight.shape[-1] - 1
        rows = _prev(prev, x, W1 + 1).transpose(1, 2)
        w = weight[:, 0].float()  # [C, W]
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        dprev = torch.zeros(B, W1, C, dtype=torch.float32, device=x.device)
        dw = torch.zeros(C, W1 + 1, dtype=torch.float32, device=x.device)

        def put(lo: int, grad: torch.Tensor) -> None:  # final grads of rows [lo, lo + n) of [prev | x]
            k = min(max(-lo, 0), grad.shape[1])  # how many fall into prev
            dprev[:, W1 + lo: W1 + lo + k] = grad[:, :k]
            dx[:, lo + k: lo + grad.shape[1]] = grad[:, k:].to(x.dtype)

        carry = None  # grads of the W-1 rows shared with the previous block, [B, W-1, C] float32
        for a, b in row_blocks(T, ctx.block_tokens):
            n = b - a
            xw, z = _conv(_window(x, rows, a, b), weight)  # [B, C, n + W-1], [B, C, n]
            s = torch.sigmoid(z)
            dz = dy[:, a:b].transpose(1, 2).float() * (s * (1 + z * (1 - s)))  # silu', [B, C, n]
            dwin = torch.zeros_like(xw, dtype=torch.float32)
            for j in range(W1 + 1):
                dwin[..., j: j + n] += dz * w[:, j, None]
                dw[:, j] += (dz * xw[..., j: j + n]).sum((0, 2))
            dwin = dwin.transpose(1, 2)  # [B, n + W-1, C]
            if carry is not None:
                dwin[:, :W1] += carry
            put(a - W1, dwin[:, :n])
            carry = dwin[:, n:]
        if carry is not None:
            put(T - W1, carry)
        dprev_out = None if prev is None else dprev.to(x.dtype).to(prev.dtype).transpose(1, 2)
        return dx, dw.view_as(weight).to(weight.dtype), dprev_out, None


def short_conv(x: torch.Tensor, weight: torch.Tensor, prev: torch.Tensor | None = None, activation: str = "silu",
               block_tokens: int = BLOCK_TOKENS, backend: KDABackend = DEFAULTS.kda_backend,
               fla: FlaKernels = FLA) -> torch.Tensor:
    """silu(causal depthwise conv of [prev | x]): x [B, T, C], weight [C, 1, W], prev [B, C, W-1] (None:
    zeros) -> [B, T, C] in x's dtype, computed in the weight's; differentiable w.r.t. all three."""
    if activation not in ("silu", "swish"):
        raise NotImplementedError(f"KDA short convolution with activation {activation!r}; only silu")
    if use_fla(x.device.type, backend, fla):
        state = None if prev is None else F.pad(prev.to(x.dtype), (1, 0))  # fla reads the last W-1 of [B, C, W]
        y, _ = fla_causal_conv1d(fla)(x=x, weight=weight[:, 0], initial_state=state, activation="silu")
        return y
    return ShortConvFunction.apply(x, weight, prev, block_tokens)


def conv_tail(x: torch.Tensor, prev: torch.Tensor | None, width: int) -> torch.Tensor:
    """The last W-1 rows of [prev | x] as the next piece's `prev`, [B, C, W-1] in x's dtype."""
    T = x.shape[1]
    if T >= width - 1:
        return x[:, T - (width - 1):].transpose(1, 2)
    return torch.cat([_prev(prev, x, width)[..., T:], x.transpose(1, 2)], dim=-1)


class KDAShortConv(LongContextModule, nn.Conv1d):
    """Upstream's KDA `conv1d` (weight `[3·H·K, 1, W]`) as `short_conv`: forward(x [B, T, C], prev) -> [B, T, C]."""

    activation: str = "silu"
    backend: KDABackend = DEFAULTS.kda_backend
    fla: FlaKernels = FLA

    def configure(self, activation: str = "silu", backend: KDABackend = DEFAULTS.kda_backend,
                  fla: FlaKernels = FLA) -> None:
        self.activation, self.backend, self.fla = activation, backend, fla

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation}, backend={self.backend}"

    def forward(self, x: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        return short_conv(x, self.weight, prev, self.activation, backend=self.backend, fla=self.fla)


def naive_short_conv(x: torch.Tensor, weight: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
    """`short_conv`'s values (same arguments and shapes), the plain way: one conv of [prev | x]."""
    full = torch.cat([_prev(prev, x, weight.shape[-1]), x.transpose(1, 2)], dim=-1)  # [B, C, W-1+T]
    out = F.silu(F.conv1d(full.to(weight.dtype), weight, groups=x.shape[-1]))  # [B, C, T]
    return out.to(x.dtype).transpose(1, 2)
