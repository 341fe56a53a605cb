"""Text-only causal LM: upstream `Glm5NextTextModel` (`model`) plus an LM head (`lm_head`).

State-dict keys are `model.*` and `lm_head.*`: the text part of a real GLM-5.3-Flash checkpoint
(`model.language_model.*`, `lm_head.*`) with the `language_model.` level removed.

Shapes: B batch, T tokens, D model dim, V vocabulary.

Labels follow Hugging Face causal LMs: pass the input ids themselves (or a copy with -100 where a
token must not be scored); the shift happens inside, position t's hidden state predicts token t+1.
`per_token_nll` is aligned with the *scored token*: `per_token_nll[b, t]` = -log p(x[b, t] | x[b, :t]),
so token t has exactly t tokens of preceding context; column 0 (nothing precedes it) and ignored
labels hold 0, and `nll_mask` marks the real entries.

The LM head + loss never builds all [B*T, V] logits (`ops.loss.chunked_cross_entropy`, chunk size
`loss_chunk_tokens`); `logits()` is the full-logits path for small T.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import ModelOutput

from genome_lm.model.ops.loss import DEFAULT_CHUNK_TOKENS, IGNORE_INDEX, chunked_cross_entropy
from genome_lm.model.upstream import Glm5NextTextConfig, Glm5NextTextModel


@dataclass
class CausalLMOutput(ModelOutput):
    """loss []: mean NLL over scored tokens; per_token_nll [B, T] float32 and nll_mask [B, T] bool
    when asked; num_targets []: how many tokens were scored; hidden [B, T, D] when asked."""

    loss: torch.Tensor | None = None
    per_token_nll: torch.Tensor | None = None
    nll_mask: torch.Tensor | None = None
    num_targets: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """[B, T] labels -> [B, T] targets: targets[:, t] = labels[:, t+1], the last column ignored."""
    return torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), IGNORE_INDEX)], dim=1)


class Glm5NextCausalLM(nn.Module):
    """`model` (upstream `Glm5NextTextModel`) + `lm_head` (`nn.Linear(D, V, bias=False)`)."""

    def __init__(self, config: Glm5NextTextConfig):
        super().__init__()
        self.config = config
        self.model = Glm5NextTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=config.initializer_range)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.loss_chunk_tokens = DEFAULT_CHUNK_TOKENS
        self.long_context_patches: dict = {}

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def hidden(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """Final hidden states [B, T, D]: the text model's `norm(mean over hc streams)`."""
        return self.model(input_ids=input_ids, use_cache=False, **kwargs).last_hidden_state

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        return_per_token_nll: bool = False,
        return_hidden: bool = False,
        **kwargs,
    ) -> CausalLMOutput:
        """Mean next-token loss over non-ignored labels, optionally per-token NLL.

        Args:
            input_ids: [B, T] int64.
            labels: [B, T] int64, normally `input_ids` (shifted inside; -100 = not scored).
                Without labels, `input_ids` are the labels when `return_per_token_nll` is set;
                otherwise no loss is computed.
            kwargs: passed to `Glm5NextTextModel` (e.g. `attention_mask`).
        Returns:
            `CausalLMOutput` with `loss` (float32, 0 when nothing is scored), `num_targets` and,
            when asked, `per_token_nll` [B, T] float32 with `nll_mask` [B, T], `hidden_states`.
        """
        hidden = self.hidden(input_ids, **kwargs)  # [B, T, D]
        if labels is None and return_per_token_nll:
            labels = input_ids
        out = CausalLMOutput(hidden_states=hidden if return_hidden else None)
        if labels is None:
            return out
        b, t, d = hidden.shape
        targets = shift_labels(labels).reshape(-1)  # [B*T]; position t predicts token t+1
        loss, nll = chunked_cross_entropy(
            hidden.reshape(b * t, d),
            self.lm_head.weight,
            targets,
            chunk_tokens=self.loss_chunk_tokens,
            ignore_index=IGNORE_INDEX,
            return_per_token=True,
        )
        out.loss = loss
        out.num_targets = (targets != IGNORE_INDEX).sum()
        if return_per_token_nll:
            pred = nll.view(b, t)  # [B, T], indexed by predicting position
            out.per_token_nll = torch.cat([pred.new_zeros(b, 1), pred[:, :-1]], dim=1)  # by scored token
            mask = labels != IGNORE_INDEX
            mask[:, 0] = False
            out.nll_mask = mask
        return out

    def logits(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """All logits [B, T, V] in float32 (small T only): logits[:, t] predicts token t+1."""
        return self.lm_head(self.hidden(input_ids, **kwargs)).float()
