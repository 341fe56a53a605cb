"""Routing by assumption: split sizes for runs whose tensors hold no values (fake tensors).

Which expert each token goes to is data: under expert parallelism the number of rows per expert
decides the all-to-all split sizes, and so the memory of the expert computation. A rehearsal on
fake tensors (`genome_lm.plan.rehearse`) has shapes but no values, so a MoE layer whose
`routing` setting is an `AssumedRouting` takes its counts from that stated assumption instead of
from the router's choice (the setting comes with the model's `ValueSource`, `model/values.py`):

    AssumedRouting(imbalance=4.0)   # this rank receives 4x the mean rows (the busiest)

A rank sends its M·k (token, expert) pairs evenly over the P ranks of its EP group and receives
`imbalance` x M·k rows, evenly over sources and its local experts (imbalance 1: uniform routing).
This is the planner's own assumption (`expert_imbalance`): the busiest expert rank of the group
is the one simulated. With `routing` None (the default) the router's choice decides.

Shapes: M tokens of a block, k experts per token, E routed experts, P EP ranks, El = E / P.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AssumedRouting:
    imbalance: float  # rows this rank receives / the mean over the EP group (>= 1)

    def __post_init__(self) -> None:
        if self.imbalance < 1:
            raise ValueError(f"imbalance is the busiest rank over the mean, >= 1; got {self.imbalance}")

    def splits(self, pairs: int, size: int, n_local: int) -> tuple[list[int], list[int], list[int]]:
        """(rows sent to each rank [P], rows received from each rank [P], rows per local expert
        [El]) for `pairs` = M·k (token, expert) pairs of this rank."""
        received = math.ceil(pairs * self.imbalance)
        return _even(pairs, size), _even(received, size), _even(received, n_local)

    def counts(self, pairs: int, num_experts: int, device: torch.device) -> torch.Tensor:
        """[E] int64 tokens per expert over the block: the pairs spread evenly."""
        return torch.tensor(_even(pairs, num_experts), dtype=torch.long, device=device)


def _even(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]
