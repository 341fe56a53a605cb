"""Expert parallelism in the MoE layer, as torchtitan's `distributed/expert_parallel.py`: routed experts
split over an EP group, rows sent to their expert's rank and back (all-to-all). Shapes: M tokens of
this rank's block, D model dim, E experts, k per token, P ranks, El = E / P experts per rank (rank p
holds [p * El, (p + 1) * El)).

`ExpertParallelExperts` computes upstream's `experts(x, idx, w)`: the M * k (token, expert) pairs
sorted by expert (stable), counts exchanged, rows sent by all-to-all, each local expert's SwiGLU on
its rows, outputs back by the reverse all-to-all, weighted and added in expert order (P = 1 gives
upstream's bits). The router and shared experts run replicated.

`AssumedRouting` (fake tensors: no values to route by): a rank sends its M * k pairs evenly over the
ranks and receives `imbalance` x M * k rows, evenly over sources and local experts (the planner's
`expert_imbalance`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from genome_lm.model.cp import GroupRank as EPContext
from genome_lm.model.ops import LongContextModule
from genome_lm.model.upstream import Glm5NextTextExperts


@dataclass(frozen=True)
class AssumedRouting:
    imbalance: float  # rows this rank receives / the mean over the EP group (>= 1, `Assumptions` checks it)


def _even(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's experts of a stacked expert weight: the local part of an EP DTensor."""
    return param.to_local() if hasattr(param, "to_local") else param


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group))


class ExpertParallelExperts(LongContextModule, Glm5NextTextExperts):
    """`Glm5NextTextExperts` over an EP group: this rank's experts for every rank's tokens (FSDP2's
    forward gathers its shard of `gate_up_proj`/`down_proj`)."""

    ep: EPContext
    routing: AssumedRouting | None = None  # None: split by the router's choice (`model/patch.py` sets an assumption)

    def configure(self, ep: EPContext) -> None:
        self.ep = ep

    def extra_repr(self) -> str:
        return f"ep={self.ep}"

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """Upstream's forward over the EP group: hidden_states [M, D], top_k_index [M, k] global expert
        ids, top_k_weights [M, k] -> [M, D]; with `routing`, split by it instead of by the ids."""
        x, idx, w, ep = hidden_states, top_k_index, top_k_weights, self.ep
        gate_up, down = _local(self.gate_up_proj), _local(self.down_proj)  # [El, 2I, D], [El, D, I]
        n_local = gate_up.shape[0]
        k = idx.shape[-1]
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)  # [M*k] pairs in expert order
        token = order // k
        send, recv, per_expert, expert_of_row = _splits(flat, n_local, ep, self.routing)
        rows = _all_to_all(x[token], recv, send, ep.group)  # [R, D] by source rank, then local expert
        by_expert = torch.argsort(expert_of_row, stable=True)  # [R]: received row of each expert row
        received = torch.empty_like(by_expert).index_copy_(0, by_expert, torch.arange(len(by_expert), device=x.device))
        rows = permute_rows(rows, by_expert, received)  # [R, D] by local expert
        up = expert_linear(rows, gate_up, per_expert)  # [R, 2I]; every rank has expert gradients
        h = torch.cat([self._apply_gate(part) for part in torch.split(up, per_expert)])  # [R, I]
        del rows, up
        done = permute_rows(expert_linear(h, down, per_expert), received, by_expert)  # [R, D] by source rank
        back = _all_to_all(done, send, recv, ep.group)  # [M*k, D] in `order`
        del done
        return add_rows(x, token, (back * w.reshape(-1)[order, None]).to(x.dtype))


class _ExpertLinear(torch.autograd.Function):
    """x [R, I] rows grouped by expert (`counts[e]` rows for expert e), weight [El, O, I] -> [R, O]:
    `F.linear(rows of e, weight[e])` per expert, bit for bit, gradients too. The weight's gradient is
    one [El, O, I] tensor written expert by expert; autograd through `weight[e]` would add a
    zero-filled [El, O, I] tensor per expert."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, counts: list[int]) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.counts = counts
        return torch.cat([F.linear(part, weight[e]) for e, part in enumerate(torch.split(x, counts))])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grads, parts = torch.split(grad, ctx.counts), torch.split(x, ctx.counts)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.cat([g.mm(weight[e]) for e, g in enumerate(grads)])
        if ctx.needs_input_grad[1]:
            grad_w = torch.empty_like(weight)
            for e, (g, part) in enumerate(zip(grads, parts)):
                torch.mm(g.t(), part, out=grad_w[e])
        return grad_x, grad_w, None


expert_linear = _ExpertLinear.apply


class _PermuteRows(torch.autograd.Function):
    """x [R, ...] -> x[index] for a permutation `index` with inverse `inverse`; keeps only `inverse`, the
    backward is one gather (indexing would scatter into a zero-filled copy)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return x[index]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        return grad[inverse], None, None


permute_rows = _PermuteRows.apply


class _AddRows(torch.autograd.Function):
    """zeros_like(like) [N, D] with each row src[j] [J, D] added into row index[j], in order of j:
    `index_add`, bit for bit, whose autograd keeps only `index` (`index_add` keeps `src` too)."""

    @staticmethod
    def forward(ctx, like: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        return torch.zeros_like(like).index_add_(0, index, src)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        return None, None, grad.index_select(0, index)


add_rows = _AddRows.apply


def _splits(flat: torch.Tensor, n_local: int, ep: EPContext, assumed: AssumedRouting | None):
    """(rows sent to each rank [P], received from each rank [P], per local expert [El], local expert
    of each received row [R]) for this rank's expert ids `flat` [M*k]: exchanged, or `assumed`."""
    if assumed is not None:  # this rank's M·k pairs spread evenly
        received = math.ceil(flat.numel() * assumed.imbalance)
        per_expert = _even(received, n_local)
        expert_of_row = torch.arange(n_local, device=flat.device).repeat_interleave(
            torch.tensor(per_expert, device=flat.device), output_size=received)
        return _even(flat.numel(), ep.size), _even(received, ep.size), per_expert, expert_of_row
    with torch.no_grad():
        counts = torch.bincount(flat, minlength=n_local * ep.size)  # [E]: rows this rank sends per expert
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=ep.group)  # [P * El]: per source, per local expert
    send = counts.view(ep.size, n_local).sum(1).tolist()
    recv = recv_counts.view(ep.size, n_local).sum(1).tolist()
    per_expert = recv_counts.view(ep.size, n_local).sum(0).tolist()
    expert_of_row = torch.repeat_interleave(torch.arange(n_local, device=flat.device).repeat(ep.size), recv_counts)
    return send, recv, per_expert, expert_of_row
