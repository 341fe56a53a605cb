"""Context parallelism in the model: the slab split (`CPContext`) and autograd-aware collectives.
Slabs are contiguous, one per rank, bounded at multiples of 64 tokens (the KDA chunk, whole k-pools)
when every rank gets a block; no padding reaches the model. Every rank runs the same collectives in
the same order, and autograd runs a CPU graph in reverse creation order, so they meet in backward too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist

from genome_lm.errors import GenomeLMError

SLAB_ALIGN = 64


def slab_bounds(T: int, cp: int) -> list[int]:
    """Token boundaries [cp + 1] of the contiguous slabs of a T-token sequence over cp ranks."""
    if T < cp:
        raise GenomeLMError(f"a sequence of {T} tokens cannot be split over parallel.cp={cp} ranks; "
                            "use data.seq_len (and data.min_piece) >= cp, or a smaller cp")
    if T >= cp * SLAB_ALIGN:
        blocks = -(-T // SLAB_ALIGN)
        bounds = [min(T, (r * blocks // cp) * SLAB_ALIGN) for r in range(cp)] + [T]
        if all(b1 > b0 for b0, b1 in zip(bounds, bounds[1:])):
            return bounds
    return [r * T // cp for r in range(cp + 1)]


@dataclass
class GroupRank:
    """One process group as a rank sees it (an EP group: `EPContext`)."""

    group: object
    rank: int
    size: int

    def __repr__(self) -> str:
        return f"rank {self.rank} of {self.size}"


@dataclass(repr=False)
class CPContext(GroupRank):
    """One CP group as a rank sees it; each forward of the causal LM sets `bounds` and this rank's slab `start`."""

    bounds: list[int] = field(default_factory=list)
    start: int = 0

    def split(self, T: int) -> tuple[int, int]:
        self.bounds = slab_bounds(T, self.size)
        self.start = self.bounds[self.rank]
        return self.start, self.bounds[self.rank + 1]

    @property
    def lengths(self) -> list[int]:
        return [b1 - b0 for b0, b1 in zip(self.bounds, self.bounds[1:])]

    def check_local(self, n: int) -> None:
        if not self.bounds or n != self.lengths[self.rank]:
            raise RuntimeError(f"context parallel: a layer got {n} tokens, the slab of rank {self.rank} is "
                               f"{self.bounds[self.rank:self.rank + 2] if self.bounds else 'not set'}; "
                               "call the causal LM (which splits the sequence), not its layers")


def _pad_to(x: torch.Tensor, length: int) -> torch.Tensor:
    if x.shape[1] == length:
        return x.contiguous()
    pad = x.new_zeros(x.shape[0], length - x.shape[1], *x.shape[2:])
    return torch.cat([x, pad], dim=1)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, lengths: tuple[int, ...], group) -> torch.Tensor:
        rank = dist.get_rank(group)
        if x.shape[1] != lengths[rank]:
            raise ValueError(f"gather_seq: rank {rank} holds {x.shape[1]} rows, lengths say {lengths[rank]}")
        longest = max(lengths)
        bufs = [x.new_empty(x.shape[0], longest, *x.shape[2:]) for _ in lengths]
        dist.all_gather(bufs, _pad_to(x, longest), group=group)
        ctx.lengths, ctx.group, ctx.rank = lengths, group, rank
        return torch.cat([b[:, :n] for b, n in zip(bufs, lengths)], dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        lengths, group, rank = ctx.lengths, ctx.group, ctx.rank
        if dist.get_backend(group) == dist.Backend.GLOO:
            total = grad.contiguous().clone()
            dist.all_reduce(total, group=group)
            return total.split(lengths, dim=1)[rank], None, None
        longest = max(lengths)
        parts = [_pad_to(part, longest) for part in grad.split(lengths, dim=1)]  # rank-major for reduce-scatter
        out = grad.new_empty(grad.shape[0], longest, *grad.shape[2:])
        dist.reduce_scatter_tensor(out, torch.cat(parts, dim=0), group=group)
        return out[:, : lengths[rank]], None, None


def gather_seq(x: torch.Tensor, lengths: Sequence[int], group) -> torch.Tensor:
    """[B, lengths[rank], ...] per rank -> [B, sum(lengths), ...] on every rank; backward gives each rank
    the summed gradient of its slice (reduce-scatter on NCCL, all-reduce and slice on gloo)."""
    return _GatherSeq.apply(x, tuple(int(n) for n in lengths), group)


class _Attach(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, *deps: torch.Tensor) -> torch.Tensor:
        ctx.deps = [(d.shape, d.dtype, d.device) for d in deps]
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (grad, *[torch.zeros(s, dtype=t, device=d) for s, t, d in ctx.deps])


def attach(x: torch.Tensor, *deps: torch.Tensor) -> torch.Tensor:
    """`x` with `deps` in its graph (zero gradient), so a rank that does not use what it gathered still
    runs the gather's backward."""
    deps = tuple(d for d in deps if d.requires_grad)
    return _Attach.apply(x, *deps) if deps and torch.is_grad_enabled() else x


def all_reduce_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """Sum of `t` over `group` (None: the world; a new tensor, no autograd)."""
    out = t.detach().clone()
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(out, group=group)
    return out
