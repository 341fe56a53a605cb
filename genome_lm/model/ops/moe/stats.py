"""Expert load statistics read from patched MoE modules after a forward."""

from __future__ import annotations

import torch
from torch import nn


def expert_load(model: nn.Module) -> dict[str, dict[str, float]]:
    """Per MoE layer name (`model.layers.3.mlp`) with `last_expert_counts` from its last forward:
    tokens per expert `max`, `mean` and `imbalance` = max / mean."""

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
