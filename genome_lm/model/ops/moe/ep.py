"""Expert parallelism inside the MoE layer: routed experts split over the ranks of an EP group,
tokens sent to the rank that holds their expert and back (all-to-all), as torchtitan's
`distributed/expert_parallel.py` does.

Shapes: M tokens of this rank's block, D model dim, E routed experts, k experts per token,
P = EP ranks, El = E / P experts per rank (rank p holds experts [p * El, (p + 1) * El)).

`ExpertParallelExperts` (installed on `Glm5NextTextExperts` by `parallel.ep.apply_expert_parallel`;
same parameters, which become DTensors sharded over the EP group) computes upstream's
`experts(x, idx, w)` as:
  1. the M * k (token, expert) pairs sorted by expert (stable: token order within an expert);
  2. counts per expert exchanged (`all_to_all_single`, no gradient) -> how many rows each rank
     receives from each source, for each of its experts;
  3. rows sent (`all_to_all_single_autograd`: its backward is the reverse all-to-all), received
     ordered by source rank, then by expert;
  4. each local expert runs upstream's SwiGLU (`_apply_gate`) on its rows, eagerly, as upstream's
     loop does; outputs go back by the reverse all-to-all;
  5. each output times its routing weight, added into its token in expert order: the sums of
     upstream's loop (`index_add_` in expert order), so one rank with P = 1 gives upstream's bits.
The router and the shared experts stay replicated and run on each rank's own tokens.

Every rank of the group must run the same number of blocks (`blocked_moe_forward` agrees on the
count), because each block is two collectives in forward and two in backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from genome_lm.model.ops.install import LongContextModule
from genome_lm.model.ops.moe.assumed import assumed_routing
from genome_lm.model.upstream import Glm5NextTextExperts


@dataclass
class EPContext:
    """One EP group as a rank sees it."""

    group: object
    rank: int
    size: int

    def __repr__(self) -> str:
        return f"rank {self.rank} of {self.size}"


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's experts of a stacked expert weight: the local part of an EP DTensor."""
    return param.to_local() if hasattr(param, "to_local") else param


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group))


class ExpertParallelExperts(LongContextModule, Glm5NextTextExperts):
    """`Glm5NextTextExperts` over an EP group: this rank computes its experts for the tokens of
    every rank (through FSDP2's forward, which gathers its shard of `gate_up_proj`/`down_proj`)."""

    upstream = Glm5NextTextExperts
    ep: EPContext

    def configure(self, ep: EPContext) -> None:
        self.ep = ep

    def extra_repr(self) -> str:
        return f"ep={self.ep}"

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return ep_experts(self, hidden_states, top_k_index, top_k_weights, self.ep)


def _splits(flat: torch.Tensor, num_experts: int, n_local: int, ep: EPContext):
    """(rows sent to each rank [P], rows received from each rank [P], rows per local expert [El],
    local expert of each received row [R]) for the expert ids `flat` [M*k] of this rank: counted
    and exchanged, or inside `assume_routing` taken from the assumption (no values needed)."""
    assumed = assumed_routing()
    if assumed is not None:
        send, recv, per_expert = assumed.splits(flat.numel(), ep.size, n_local)
        local = torch.arange(n_local, device=flat.device)
        return send, recv, per_expert, local.repeat_interleave(torch.tensor(per_expert, device=flat.device),
                                                               output_size=sum(recv))
    with torch.no_grad():
        counts = torch.bincount(flat, minlength=num_experts)  # [E]: rows this rank sends per expert
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=ep.group)  # [P * El]: per source, per local expert
    send = counts.view(ep.size, n_local).sum(1).tolist()
    recv = recv_counts.view(ep.size, n_local).sum(1).tolist()
    per_expert = recv_counts.view(ep.size, n_local).sum(0).tolist()
    expert_of_row = torch.repeat_interleave(torch.arange(n_local, device=flat.device).repeat(ep.size), recv_counts)
    return send, recv, per_expert, expert_of_row


def ep_experts(experts: Glm5NextTextExperts, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor,
               ep: EPContext) -> torch.Tensor:
    """Routed experts over the EP group: x [M, D], idx [M, k] global expert ids, w [M, k] routing
    weights -> [M, D] (upstream `Glm5NextTextExperts.forward` on all E experts)."""
    gate_up, down = _local(experts.gate_up_proj), _local(experts.down_proj)  # [El, 2I, D], [El, D, I]
    n_local = gate_up.shape[0]
    num_experts = n_local * ep.size
    k = idx.shape[-1]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)  # [M*k] pairs in expert order
    token = order // k
    send, recv, per_expert, expert_of_row = _splits(flat, num_experts, n_local, ep)
    rows = _all_to_all(x[token], recv, send, ep.group)  # [R, D] by source rank, then local expert
    by_expert = torch.argsort(expert_of_row, stable=True)
    outs = [F.linear(experts._apply_gate(F.linear(part, gate_up[e])), down[e])  # also with 0 rows: every
            for e, part in enumerate(torch.split(rows[by_expert], per_expert))]  # rank has expert gradients
    done = torch.empty_like(rows).index_copy(0, by_expert, torch.cat(outs))
    back = _all_to_all(done, send, recv, ep.group)  # [M*k, D] in `order`
    final = torch.zeros_like(x)
    return final.index_add(0, token, (back * w.reshape(-1)[order, None]).to(final.dtype))
