"""Routing by assumption: split sizes for runs whose tensors hold no values (fake tensors).

Which expert each token goes to is data: under expert parallelism the number of rows per expert
decides the all-to-all split sizes, and so the memory of the expert computation. A rehearsal on
fake tensors (`genome_lm.train.rehearse`) has shapes but no values, so inside `assume_routing`
the MoE ops take their counts from a stated assumption instead of from the router's choice:

    with assume_routing(imbalance=4.0):   # this rank receives 4x the mean rows (the busiest)
        model(**batch)

A rank sends its M·k (token, expert) pairs evenly over the P ranks of its EP group and receives
`imbalance` x M·k rows, evenly over sources and its local experts (imbalance 1: uniform routing).
This is the planner's own assumption (`expert_imbalance`): the busiest expert rank of the group
is the one simulated. Outside the context nothing changes.

Shapes: M tokens of a block, k experts per token, E routed experts, P EP ranks, El = E / P.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch


@dataclass(frozen=True)
class AssumedRouting:
    imbalance: float  # rows this rank receives / the mean over the EP group (>= 1)

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


_ASSUMED: list[AssumedRouting] = []


@contextlib.contextmanager
def assume_routing(imbalance: float = 1.0) -> Iterator[AssumedRouting]:
    """Inside: the MoE ops split by `AssumedRouting(imbalance)` instead of by the router's choice."""
    if imbalance < 1:
        raise ValueError(f"imbalance is the busiest rank over the mean, >= 1; got {imbalance}")
    _ASSUMED.append(AssumedRouting(float(imbalance)))
    try:
        yield _ASSUMED[-1]
    finally:
        _ASSUMED.pop()


def assumed_routing() -> AssumedRouting | None:
    """The routing assumption in force, or None (route by the data)."""
    return _ASSUMED[-1] if _ASSUMED else None
