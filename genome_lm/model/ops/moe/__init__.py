"""MoE in token blocks with per-expert load statistics (`naive` = upstream `Glm5NextTextMoE`)."""

from genome_lm.model.ops.moe.chunk import BlockedGlm5NextTextMoE, expert_load
from genome_lm.model.ops.moe.naive import naive_moe_forward

__all__ = ["BlockedGlm5NextTextMoE", "naive_moe_forward", "expert_load"]
