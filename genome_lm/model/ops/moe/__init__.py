"""MoE in token blocks with per-expert load statistics (`naive` = upstream `Glm5NextTextMoE`)."""

from genome_lm.model.ops.moe.chunk import BlockedGlm5NextTextMoE, blocked_moe_forward, expert_load
from genome_lm.model.ops.moe.naive import expert_counts, naive_moe_forward

__all__ = ["BlockedGlm5NextTextMoE", "blocked_moe_forward", "expert_counts", "naive_moe_forward", "expert_load"]
