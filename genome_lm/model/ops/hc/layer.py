"""Hyper-connection weights recomputed in backward: upstream's math, a fraction of its memory.

Upstream's `Glm5NextTextHyperConnection.forward(h)` (h: hc_mult streams [B, T, S, D]) flattens and
RMS-normalises the streams in float32, projects them to (2 + S)·S logits per token and runs
`hc_sinkhorn_iters` (20) Sinkhorn normalisations on the [S, S] comb matrix. Autograd keeps every
intermediate: the float32 copy of the streams and its normalised version (2·S·D floats per token)
and ~2·iters [S, S] matrices (sizes: docs/model.md, "Hyper-connections").

`RecomputedHyperConnection` runs the same forward under non-reentrant activation checkpointing: what is
kept for backward is only the input streams (alive anyway: the decoder layer's residual) and the
outputs (post [B, T, S], comb [B, T, S, S], collapsed [B, T, D]); the intermediates are rebuilt
for backward from the input. Everything is per token, so the rebuild is exact (same ops, same
inputs). Without autograd (inference, or inside a recomputed layer's no-grad forward) it is
upstream's forward as is.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from genome_lm.model.ops.install import LongContextModule
from genome_lm.model.upstream import glm

__all__ = ["RecomputedHyperConnection", "upstream_hc_forward"]

upstream_hc_forward = glm.Glm5NextTextHyperConnection.forward


class RecomputedHyperConnection(LongContextModule, glm.Glm5NextTextHyperConnection):
    """`Glm5NextTextHyperConnection` whose intermediates are rebuilt in backward; forward
    returns (post [B, T, S], comb [B, T, S, S], collapsed [B, T, D]) as upstream."""

    upstream = glm.Glm5NextTextHyperConnection

    def configure(self) -> None:
        pass

    def forward(self, hidden_streams: torch.Tensor):
        if torch.is_grad_enabled() and (hidden_streams.requires_grad
                                        or any(p.requires_grad for p in self.parameters())):
            return checkpoint(upstream_hc_forward, self, hidden_streams, use_reentrant=False)
        return upstream_hc_forward(self, hidden_streams)
