"""Auxiliary-loss-free expert balancing (DeepSeek-V3 §2.1.2; docs/train.md, "Expert balancing"): after every
optimizer step each router's `e_score_correction_bias` moves by

    bias_e += rate * sign(mean_load - load_e)

with `load_e` the tokens routed to expert e in the step over every micro-batch and rank (so the bias stays
identical on all ranks)."""

from __future__ import annotations

import torch
from torch import nn

from genome_lm.model.cp import all_reduce_sum
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.patch import has_values

__all__ = ["ExpertBalancer"]


class ExpertBalancer:
    """Sums `last_expert_counts` of patched MoE layers over a step, then moves router biases; with EP also
    `rank_imbalance` (the busiest expert rank's tokens over the mean, in the worst layer). Rate 0, no EP: idle."""

    def __init__(self, model: nn.Module, rate: float, ep: int = 1):
        if rate < 0:
            raise ValueError(f"bias update rate must be >= 0, got {rate}")
        self.rate, self.ep = float(rate), ep
        self.rank_imbalance: float | None = None
        self.layers = [m for m in model.modules() if isinstance(m, BlockedGlm5NextTextMoE)]
        self._counts: list[torch.Tensor | None] = [None] * len(self.layers)
        self.active = (self.rate > 0 or ep > 1) and bool(self.layers)

    def accumulate(self) -> None:
        """Add each layer's counts from the forward just run (once per micro-batch)."""
        if not self.active:
            return
        for i, m in enumerate(self.layers):
            if m.last_expert_counts is not None:
                c, before = m.last_expert_counts.detach(), self._counts[i]
                self._counts[i] = c if before is None else before + c

    @torch.no_grad()
    def step(self, update: bool = True) -> float | None:
        """Move every router's bias by the step's loads over all ranks (not for a skipped step), reset the
        counts; the largest |bias| afterwards, or None when balancing is off."""
        if not self.active:
            return None
        counts, self._counts = self._counts, [None] * len(self.layers)
        present = [i for i, c in enumerate(counts) if c is not None]
        counted = [c for c in counts if c is not None]  # the counts of `present`, in its order
        loads = all_reduce_sum(torch.stack(counted).double()) if counted else None  # [L, E]
        if self.ep > 1 and loads is not None:
            per_rank = loads.view(len(present), self.ep, -1).sum(-1)  # [L, ep]: tokens each expert rank computed
            ratio = (per_rank.max(1).values / per_rank.mean(1).clamp_min(1e-9)).max()
            self.rank_imbalance = float(ratio) if has_values(ratio) else None  # none on fake tensors
        if self.rate == 0:
            return None
        if update and loads is not None:
            delta = self.rate * torch.sign(loads.mean(dim=1, keepdim=True) - loads)
            for row, i in enumerate(present):
                bias = self.layers[i].gate.e_score_correction_bias
                bias.add_(delta[row].to(bias.dtype))
        largest = torch.stack([m.gate.e_score_correction_bias.abs().max() for m in self.layers]).max()
        return float(largest) if has_values(largest) else None
