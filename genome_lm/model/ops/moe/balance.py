"""Auxiliary-loss-free expert balancing (DeepSeek-V3 §2.1.2), as GLM-5.3 routers are built for.

Each `Glm5NextTextTopkRouter` chooses experts by `sigmoid(logits) + e_score_correction_bias`
(the gate weights still come from the unbiased scores). Upstream has no rule that moves the
bias, so during fine-tuning it stays as loaded and routing can collapse onto a few experts (the
demo's 8-expert model sent every token to 2 of them). DeepSeek-V3's rule, also Megatron's
`moe_router_bias_update_rate`: after every optimizer step,

    bias_e += rate * sign(mean_load - load_e)

with `load_e` the tokens routed to expert e during the step, counted over every micro-batch and
every rank (DP replicas and CP slabs), so the bias stays identical on all ranks. The bias is a
persistent buffer: checkpoints, resume and the model/ export carry it. It is not a parameter:
no gradient, no optimizer state.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["ExpertBalancer"]


class ExpertBalancer:
    """Sums `last_expert_counts` of patched MoE layers over a step, then moves router biases."""

    def __init__(self, model: nn.Module, rate: float):
        if rate < 0:
            raise ValueError(f"bias update rate must be >= 0, got {rate}")
        self.rate = float(rate)
        self.layers = [m for m in model.modules() if hasattr(m, "last_expert_counts") and hasattr(m, "gate")]
        self._counts: list[torch.Tensor | None] = [None] * len(self.layers)

    @property
    def active(self) -> bool:
        return self.rate > 0 and bool(self.layers)

    def accumulate(self) -> None:
        """Add each layer's counts from the forward just run (call once per micro-batch)."""
        for i, m in enumerate(self.layers):
            c = m.last_expert_counts
            if c is None:
                continue
            c = c.detach().to(torch.float64)
            self._counts[i] = c if self._counts[i] is None else self._counts[i] + c

    @torch.no_grad()
    def step(self, update: bool = True) -> float:
        """Move every router's bias by the step's loads (all ranks reduced); reset the counts.

        `update=False` (a skipped step) only resets. Returns the largest |bias| afterwards.
        """
        counts, self._counts = self._counts, [None] * len(self.layers)
        if not self.active or not update:
            return self.max_abs_bias()
        present = [i for i, c in enumerate(counts) if c is not None]
        if present:
            loads = torch.stack([counts[i] for i in present])  # [L, E]
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                device = self.layers[present[0]].gate.e_score_correction_bias.device
                loads = loads.to(device)
                dist.all_reduce(loads)
            delta = self.rate * torch.sign(loads.mean(dim=1, keepdim=True) - loads)
            for row, i in enumerate(present):
                bias = self.layers[i].gate.e_score_correction_bias
                bias.add_(delta[row].to(bias.device, bias.dtype))
        return self.max_abs_bias()

    def max_abs_bias(self) -> float:
        return max((float(m.gate.e_score_correction_bias.abs().max()) for m in self.layers), default=0.0)
