"""MoE in token blocks, with per-expert load statistics. Routing and experts are per token upstream, so
upstream's submodules on consecutive blocks of M = `block_tokens` tokens give the result of all N at
once, with transients O(M*k*I), not O(N*k*I); with `recompute` each block keeps only its input
slice. Under EP (`ep.py`) the ranks agree on the number of blocks, so they meet in every block's
all-to-alls. The plain reference, `naive_moe_forward`, is upstream's `Glm5NextTextMoE.forward` itself.

Upstream routing: sigmoid scores of float32 router logits, choice by `scores + e_score_correction_bias`
within the top `topk_group` of `n_group` groups, weights the chosen uncorrected scores normalised to
sum 1 times `routed_scaling_factor`. Output: routed experts' weighted SwiGLU + shared experts.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.moe.ep import AssumedRouting, EPContext, _even
from genome_lm.model.upstream import Glm5NextTextExperts, Glm5NextTextMoE
from genome_lm.settings import DEFAULTS


def naive_moe_forward(module: Glm5NextTextMoE, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's forward of a (patched or not) `Glm5NextTextMoE` on hidden [B, T, D] -> (out, counts [E])."""
    out = Glm5NextTextMoE.forward(module, hidden)
    with torch.no_grad():
        _, _, topk_indices = module.gate(hidden)  # [N, k]
    return out, _counts(topk_indices, module.experts.num_experts)


def _experts(experts: Glm5NextTextExperts, x: torch.Tensor, topk_indices: torch.Tensor, topk_weights: torch.Tensor):
    """Upstream's experts on x [M, D] as the config names them, except float32 on CUDA, where torch's
    grouped_mm takes bf16 only: there upstream's eager loop (the same arithmetic)."""
    # upstream's class decorator `use_experts_implementation` sets `config` and wraps `forward` (`__wrapped__`),
    # which its annotations do not show
    if getattr(experts, "ep", None) is None and x.is_cuda and x.dtype == torch.float32 and \
            experts.config._experts_implementation == "grouped_mm":  # type: ignore[union-attr]
        return type(experts).forward.__wrapped__(experts, x, topk_indices, topk_weights)  # type: ignore[attr-defined]
    return experts(x, topk_indices, topk_weights)


def _moe_block(module: Glm5NextTextMoE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream MoE on one block: x [M, D] -> (out [M, D], topk_indices [M, k])."""
    _, topk_weights, topk_indices = module.gate(x)
    return _experts(module.experts, x, topk_indices, topk_weights) + module.shared_experts(x), topk_indices


def _counts(idx: torch.Tensor, num_experts: int, assumed: AssumedRouting | None = None) -> torch.Tensor:
    """[E] int64 tokens per expert of expert ids idx [..., k]: counted, or spread evenly by `assumed`."""
    if assumed is not None:
        return torch.tensor(_even(idx.numel(), num_experts), dtype=torch.long, device=idx.device)
    return torch.bincount(idx.reshape(-1).long(), minlength=num_experts)


class BlockedGlm5NextTextMoE(LongContextModule, Glm5NextTextMoE):
    """`Glm5NextTextMoE` in blocks of `block_tokens` tokens (each recomputed in backward when `recompute`)."""

    block_tokens: int = DEFAULTS.moe_block_tokens
    recompute: bool = DEFAULTS.moe_recompute
    last_expert_counts: torch.Tensor | None = None
    ep: EPContext | None = None  # set by `parallel.apply_expert_parallel`
    routing: AssumedRouting | None = None  # None: the router's choice (`model/patch.py` sets an assumption)

    def configure(self, block_tokens: int = DEFAULTS.moe_block_tokens,
                  recompute: bool = DEFAULTS.moe_recompute) -> None:
        if block_tokens < 1:
            raise ValueError(f"moe block_tokens must be positive, got {block_tokens}")
        self.block_tokens, self.recompute, self.last_expert_counts = int(block_tokens), bool(recompute), None

    def extra_repr(self) -> str:
        ep = f", ep={self.ep}" if self.ep is not None else ""
        return f"block_tokens={self.block_tokens}, recompute={self.recompute}{ep}"

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[..., D] -> [..., D]; sets `last_expert_counts`, tokens per routed expert [E] int64 (with a
        `routing`, counts and EP splits follow it, not the router)."""
        shape, assumed, block_tokens = hidden_states.shape, self.routing, self.block_tokens
        x = hidden_states.reshape(-1, shape[-1])  # [N, D]
        n = x.shape[0]
        counts = torch.zeros(self.gate.num_experts, dtype=torch.long, device=x.device)
        use_ckpt = self.recompute and torch.is_grad_enabled() and n > 0
        if self.ep is not None and assumed is None:  # every EP rank runs as many blocks as the busiest
            blocks = torch.tensor([-(-n // block_tokens)], device=x.device)
            torch.distributed.all_reduce(blocks, torch.distributed.ReduceOp.MAX, group=self.ep.group)
            block_tokens = max(1, -(-n // int(blocks)))
        elif n <= block_tokens and not use_ckpt:
            out, idx = _moe_block(self, x)
            self.last_expert_counts = counts + _counts(idx, counts.numel(), assumed)
            return out.view(shape)

        out = x.new_empty(x.shape)  # [N, D]; block outputs are copied in, not concatenated
        # split, not sliced: backward joins the blocks' input gradients once, where each slice's backward
        # would make a zero-filled [N, D] gradient and add it to the sum
        for start, xb in zip(range(0, n, block_tokens), torch.split(x, block_tokens)):  # xb [M, D]
            if use_ckpt:
                yb, idx = checkpoint(_moe_block, self, xb, use_reentrant=False)
            else:
                yb, idx = _moe_block(self, xb)
            out[start : start + block_tokens] = yb
            counts += _counts(idx, counts.numel(), assumed)
        self.last_expert_counts = counts
        return out.view(shape)


def expert_load(model: nn.Module) -> dict[str, dict[str, float]]:
    """Per MoE layer name with `last_expert_counts`: tokens per expert `max`, `mean`, `imbalance` = max / mean."""
    stats = {}
    for name, module in model.named_modules():
        counts = getattr(module, "last_expert_counts", None)
        if not isinstance(counts, torch.Tensor):
            continue
        counts = counts.detach().float()
        mean, top = counts.mean().item(), counts.max().item()
        stats[name] = {"max": top, "mean": mean, "imbalance": top / mean if mean > 0 else 0.0}
    return stats
