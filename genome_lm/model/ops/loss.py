"""LM head + cross-entropy, float32 loss and per-token NLL: `chunked_cross_entropy` without all N x V
logits, `naive_cross_entropy` (the reference) with them. Logits are computed in `hidden`/`weight`'s
dtype, as upstream's `lm_head`, then upcast. Shapes: N tokens, D model dim, V vocabulary.

Forward walks C = `chunk_tokens` tokens at a time, keeping only the [N] float32 log-sum-exp.
Backward recomputes each chunk's logits and forms
    d logits = (softmax - onehot(target)) * g      (g = incoming grad of that token's NLL)
    d hidden[chunk] = d logits @ W,   d W += d logits^T @ hidden[chunk]   (float32 accumulator)
so peak extra memory is O(C * V + V * D) whatever N is. Ignored targets get NLL 0 and no gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genome_lm.genome.tokenizer import IGNORE_INDEX
from genome_lm.model.ops.norm import row_blocks

DEFAULT_CHUNK_TOKENS = 2048


def _chunk_logits(hidden_c: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hidden_c @ weight.t()).float()  # [C, V]


class ChunkedCrossEntropy(torch.autograd.Function):
    """nll[N] = logsumexp(h W^T) - (h W^T)[target], chunk by chunk; recomputes logits in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens: int, ignore_index: int):
        n = hidden.shape[0]
        nll = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        lse = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        for start, end in row_blocks(n, chunk_tokens):
            logits = _chunk_logits(hidden[start:end], weight)  # [C, V]
            tgt = targets[start:end]
            valid = tgt != ignore_index
            lse_c = torch.logsumexp(logits, dim=-1)  # [C]
            target_logit = logits.gather(1, torch.where(valid, tgt, 0)[:, None]).squeeze(1)  # [C]
            nll[start:end] = torch.where(valid, lse_c - target_logit, 0.0)
            lse[start:end] = lse_c
            del logits
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk_tokens = chunk_tokens
        ctx.ignore_index = ignore_index
        return nll

    @staticmethod
    def backward(ctx, grad_nll):
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start, end in row_blocks(hidden.shape[0], ctx.chunk_tokens):
            h = hidden[start:end]
            tgt = targets[start:end]
            valid = tgt != ctx.ignore_index
            g = torch.where(valid, grad_nll[start:end].float(), 0.0)  # [C]
            logits = _chunk_logits(h, weight)  # [C, V]
            dlogits = torch.exp_(logits.sub_(lse[start:end, None]))  # softmax, in place
            dlogits.mul_(g[:, None])
            dlogits.scatter_add_(1, torch.where(valid, tgt, 0)[:, None], -g[:, None])
            if grad_h is not None:
                grad_h[start:end] = (dlogits.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_w is not None:
                grad_w.addmm_(dlogits.t(), h.float())
            del logits, dlogits
        return grad_h, (None if grad_w is None else grad_w.to(weight.dtype)), None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_tokens: int = DEFAULT_CHUNK_TOKENS, ignore_index: int = IGNORE_INDEX,
                          return_per_token: bool = False):
    """`naive_cross_entropy`, never holding more than [chunk_tokens, V] logits."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    nll = ChunkedCrossEntropy.apply(hidden, weight, targets, int(chunk_tokens), int(ignore_index))  # [N]
    loss = nll.sum() / (targets != ignore_index).sum().clamp(min=1)
    return (loss, nll) if return_per_token else loss


def naive_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                        ignore_index: int = IGNORE_INDEX, return_per_token: bool = False):
    """hidden [N, D], LM head weight [V, D], targets [N] -> mean float32 NLL over the targets that are
    not `ignore_index` (0 if none); with `return_per_token`, (loss, nll [N] float32, 0 where ignored)."""
    logits = F.linear(hidden, weight).float()  # [N, V]
    nll = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="none")  # [N]
    loss = nll.sum() / (targets != ignore_index).sum().clamp(min=1)
    return (loss, nll) if return_per_token else loss
