"""Plain reference for the MoE block: upstream `Glm5NextTextMoE.forward` itself, all tokens at once.
Upstream routing: sigmoid scores of float32 router logits, choice by `scores + e_score_correction_bias`
within the top `topk_group` of `n_group` groups, weights the chosen uncorrected scores normalised to
sum 1 times `routed_scaling_factor`. Output: routed experts' weighted SwiGLU + shared experts.
"""

from __future__ import annotations

import torch

from genome_lm.model.upstream import Glm5NextTextMoE


def expert_counts(topk_indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Tokens routed to each expert: [..., k] expert ids -> [E] int64 counts."""
    return torch.bincount(topk_indices.reshape(-1).long(), minlength=num_experts)


def naive_moe_forward(module: Glm5NextTextMoE, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's forward of a (patched or not) `Glm5NextTextMoE` on hidden [B, T, D] -> (out, counts [E])."""
    out = Glm5NextTextMoE.forward(module, hidden)
    with torch.no_grad():
        _, _, topk_indices = module.gate(hidden)  # [N, k]
    return out, expert_counts(topk_indices, module.experts.num_experts)
