"""Context parallelism (CP): each sequence split into contiguous slabs, one per rank of a CP group.

    cp = apply_context_parallel(model, group)   # after apply_long_context, before recompute / FSDP
    out = model(input_ids, labels=input_ids)    # every CP rank passes the same full [B, T] batch

The causal LM's forward is replaced: it takes the full batch, keeps this rank's slab of tokens
[B, T_r], runs the decoder on it and scores it. Layers are swapped from outside, the model code
stays single-device:
  - KDA (`cp_kda`): recurrent state composed across slabs from all-gathered affine maps; conv
    tails all-gathered;
  - DSA (`cp_dsa`): latent rows and index keys all-gathered, top-k over the global causal prefix;
  - hyper-connections, norms, MoE, embeddings: token-local, unchanged.

Slabs: boundaries at multiples of 64 tokens (the KDA chunk; also whole k-pools) when every rank
gets at least one such block, the last slab taking the remainder; shorter sequences are split as
evenly as possible (T >= cp tokens). No padding: collectives pad internally, the model never
sees a padded token, so results equal one process for any T.

Loss: the mean over all scored tokens of the sequence across the CP group. Each rank's
`out.loss` has that value; its gradient is this rank's share (its NLL sum / the group's target
count), so the sum of the ranks' gradients is the gradient of the mean: reduce gradients over CP
ranks with SUM (FSDP in `parallel.fsdp` does, over dp x cp, with the trainer normalising by the
global target count).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from genome_lm.errors import GenomeLMError
from genome_lm.model.causal_lm import IGNORE_INDEX, CausalLMOutput, shift_labels
from genome_lm.model.ops.loss import chunked_cross_entropy
from genome_lm.parallel.collectives import all_reduce_sum, gather_seq

SLAB_ALIGN = 64


def slab_bounds(T: int, cp: int, align: int = SLAB_ALIGN) -> list[int]:
    """Token boundaries [cp + 1] of the contiguous slabs of a T-token sequence over cp ranks."""
    if T < cp:
        raise GenomeLMError(f"a sequence of {T} tokens cannot be split over parallel.cp={cp} ranks; "
                            "use data.seq_len (and data.min_piece) >= cp, or a smaller cp")
    if T >= cp * align:
        blocks = -(-T // align)
        bounds = [min(T, (r * blocks // cp) * align) for r in range(cp)] + [T]
        if all(b1 > b0 for b0, b1 in zip(bounds, bounds[1:])):
            return bounds
    return [r * T // cp for r in range(cp + 1)]


@dataclass
class CPContext:
    """One CP group as a rank sees it; `bounds` are set by each forward of the causal LM."""

    group: object
    rank: int
    size: int
    align: int = SLAB_ALIGN
    bounds: list[int] = field(default_factory=list)

    def split(self, T: int) -> tuple[int, int]:
        self.bounds = slab_bounds(T, self.size, self.align)
        return self.start, self.end

    @property
    def start(self) -> int:
        return self.bounds[self.rank]

    @property
    def end(self) -> int:
        return self.bounds[self.rank + 1]

    @property
    def lengths(self) -> list[int]:
        return [b1 - b0 for b0, b1 in zip(self.bounds, self.bounds[1:])]

    def check_local(self, n: int) -> None:
        if not self.bounds or n != self.end - self.start:
            raise RuntimeError(f"context parallel: a layer got {n} tokens, the slab of rank {self.rank} is "
                               f"{self.bounds[self.rank:self.rank + 2] if self.bounds else 'not set'}; "
                               "call the causal LM (which splits the sequence), not its layers")


def cp_lm_forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                  return_per_token_nll: bool = False, return_hidden: bool = False, **kwargs) -> CausalLMOutput:
    """`Glm5NextCausalLM.forward` under CP: same arguments (the full [B, T] batch on every CP rank).

    Returns `loss` (the group's mean; this rank's share of its gradient), `num_targets` (the
    group's), `per_token_nll` / `nll_mask` [B, T] for the whole sequence when asked (gathered, no
    gradient), `hidden_states` of this rank's slab [B, T_r, D] when asked.
    """
    cp: CPContext = self._genome_lm_cp
    B, T = input_ids.shape
    s, e = cp.split(T)
    if kwargs.get("attention_mask") is not None:
        kwargs["attention_mask"] = kwargs["attention_mask"][:, s:e]
    hidden = self.hidden(input_ids[:, s:e], **kwargs)  # [B, T_r, D]
    if labels is None and return_per_token_nll:
        labels = input_ids
    out = CausalLMOutput(hidden_states=hidden if return_hidden else None)
    if labels is None:
        return out
    targets = shift_labels(labels)[:, s:e].reshape(-1)  # [B*T_r]: position t predicts t+1, across slabs
    _, nll = chunked_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), self.lm_head.weight, targets,
                                   chunk_tokens=self.loss_chunk_tokens, ignore_index=IGNORE_INDEX,
                                   return_per_token=True)  # nll [B*T_r] float32, 0 where ignored
    local = nll.sum()
    totals = all_reduce_sum(torch.stack([local.detach(), (targets != IGNORE_INDEX).sum().to(local.dtype)]), cp.group)
    count = totals[1].clamp(min=1)
    out.loss = local / count + (totals[0] - local.detach()) / count  # value: group mean; grad: this slab's share
    out.num_targets = totals[1].to(torch.int64)
    if return_per_token_nll:
        with torch.no_grad():
            pred = gather_seq(nll.detach().view(B, e - s), cp.lengths, cp.group)  # [B, T], by predicting position
        out.per_token_nll = torch.cat([pred.new_zeros(B, 1), pred[:, :-1]], dim=1)
        mask = labels != IGNORE_INDEX
        mask[:, 0] = False
        out.nll_mask = mask
    return out


def apply_context_parallel(model: nn.Module, group=None) -> CPContext | None:
    """Split every sequence over the ranks of `group` (default: the world), in place.

    `model` is the causal LM from `genome_lm.model.build` with `apply_long_context` applied (its
    KDA and DSA modules patched). A group of one rank leaves the model as it is (returns None).
    """
    from genome_lm.model.ops.dsa import is_patched as is_dsa_patched
    from genome_lm.model.ops.kda import is_kda_patched
    from genome_lm.model.upstream import Glm5NextTextAttention, Glm5NextTextLinearAttention
    from genome_lm.parallel.cp_dsa import patch_cp_dsa
    from genome_lm.parallel.cp_kda import patch_cp_kda

    size = dist.get_world_size(group)
    if size == 1:
        return None
    if not hasattr(model, "lm_head"):
        raise TypeError("apply_context_parallel needs the causal LM from genome_lm.model.build")
    cp = CPContext(group=group, rank=dist.get_rank(group), size=size)
    for m in model.modules():
        if isinstance(m, Glm5NextTextLinearAttention):
            if not is_kda_patched(m):
                raise RuntimeError("apply_context_parallel: apply_long_context first (KDA is not patched)")
            patch_cp_kda(m, cp)
        elif isinstance(m, Glm5NextTextAttention):
            if not is_dsa_patched(m):
                raise RuntimeError("apply_context_parallel: apply_long_context first (DSA is not patched)")
            patch_cp_dsa(m, cp)
    model._genome_lm_cp = cp
    model.forward = types.MethodType(cp_lm_forward, model)
    return cp
