"""Plain reference for the LM head + cross-entropy: all logits at once, then `F.cross_entropy`.

Shapes: N tokens (flattened B*T), D model dim, V vocabulary.
The logits are computed in the dtype of `hidden`/`weight` (as upstream's `lm_head` does) and
upcast to float32 before the softmax, so the loss and per-token NLL are float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genome_lm.genome.tokenizer import IGNORE_INDEX  # re-exported by ops.loss


def naive_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    return_per_token: bool = False,
):
    """hidden [N, D], LM head weight [V, D], targets [N] -> mean float32 NLL over the targets that are
    not `ignore_index` (0 if none); with `return_per_token`, (loss, nll [N] float32, 0 where ignored)."""

    logits = F.linear(hidden, weight).float()  # [N, V]
    nll = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="none")  # [N]
    count = (targets != ignore_index).sum().clamp(min=1)
    loss = nll.sum() / count
    return (loss, nll) if return_per_token else loss
