"""Text-only causal LM: upstream `Glm5NextTextModel` (`model`) plus `lm_head`; state-dict keys are a real
checkpoint's text part without the `language_model.` level. Shapes: B batch, T tokens, D model dim.
Labels as Hugging Face causal LMs' (-100: not scored; shifted inside). `per_token_nll[b, t]` =
-log p(x[b, t] | x[b, :t]), 0 in column 0 and at ignored labels (`nll_mask` marks the real ones).
The loss never builds all [B*T, V] logits; `logits()` does, for small T."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache
from transformers.utils import ModelOutput

from genome_lm.errors import GenomeLMError
from genome_lm.model.cp import CPContext, all_reduce_sum, gather_seq
from genome_lm.model.ops.loss import DEFAULT_CHUNK_TOKENS, IGNORE_INDEX, chunked_cross_entropy
from genome_lm.model.upstream import Glm5NextTextConfig, Glm5NextTextModel


@dataclass
class CausalLMOutput(ModelOutput):  # what `Glm5NextCausalLM.forward` returns (see there)
    loss: torch.Tensor | None = None
    per_token_nll: torch.Tensor | None = None
    nll_mask: torch.Tensor | None = None
    num_targets: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    cache: object | None = None


class Glm5NextCausalLM(nn.Module):
    def __init__(self, config: Glm5NextTextConfig):
        super().__init__()
        self.config = config
        self.model = Glm5NextTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=config.initializer_range)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.loss_chunk_tokens = DEFAULT_CHUNK_TOKENS
        self.cp: CPContext | None = None  # a CPContext under context parallelism (`apply_context_parallel`)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """Final hidden states [B, T, D]; with a transformers `cache`, continuing (and updating) it."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                          use_cache=cache is not None).last_hidden_state

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, return_per_token_nll: bool = False,
                return_hidden: bool = False, *, attention_mask: torch.Tensor | None = None,
                use_cache: bool | None = None, cache=None, past_key_values=None, return_dict: bool | None = None,
                **unsupported) -> CausalLMOutput | tuple:
        """Mean next-token loss (float32, 0 when nothing is scored) of input_ids [B, T] over `labels`
        (default: the input ids when `return_per_token_nll`, else no loss), with `num_targets` and,
        when asked, `per_token_nll` / `nll_mask` [B, T], `hidden_states`, `cache` (`use_cache`: a new
        `DynamicCache` unless one is given; the loss covers this call's tokens only).
        Under context parallelism each CP rank gets the full batch and runs its slab [B, T_r]: `loss`
        is the group's mean, its gradient this rank's share, `num_targets` the group's,
        `per_token_nll` gathered (no gradient), `hidden_states` the slab's.
        """
        if unsupported:
            raise GenomeLMError(
                f"Glm5NextCausalLM: {', '.join(sorted(unsupported))} not supported; it takes input_ids, labels, "
                "attention_mask, use_cache, cache (or past_key_values), return_dict, return_per_token_nll and "
                "return_hidden (all logits of a short input: model.logits(input_ids))")
        if cache is not None and past_key_values is not None:
            raise GenomeLMError("Glm5NextCausalLM: give cache or past_key_values (the same thing), not both")
        cache = cache if cache is not None else past_key_values
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        cp = self.cp
        if cache is not None and cp is not None:
            raise GenomeLMError("Glm5NextCausalLM: a cache runs in one process (this model is context-parallel)")
        B, T = input_ids.shape
        s, e = cp.split(T) if cp is not None else (0, T)
        if cp is not None and attention_mask is not None:
            attention_mask = attention_mask[:, s:e]
        hidden = self.hidden(input_ids[:, s:e], attention_mask, cache)  # [B, T_r, D]
        if labels is None and return_per_token_nll:
            labels = input_ids
        out = CausalLMOutput(hidden_states=hidden if return_hidden else None, cache=cache)
        if labels is None:
            return out.to_tuple() if return_dict is False else out
        targets = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), IGNORE_INDEX)], dim=1)  # shifted
        targets = targets[:, s:e].reshape(-1)  # [B*T_r]; position t predicts token t+1
        loss, nll = chunked_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), self.lm_head.weight, targets,
                                          chunk_tokens=self.loss_chunk_tokens, ignore_index=IGNORE_INDEX,
                                          return_per_token=True)  # nll [B*T_r] float32, 0 where ignored
        if cp is None:
            out.loss, out.num_targets = loss, (targets != IGNORE_INDEX).sum()
            pred = nll.view(B, T)  # [B, T], indexed by predicting position
        else:
            local = nll.sum()
            totals = all_reduce_sum(torch.stack([local.detach(), (targets != IGNORE_INDEX).sum().to(local.dtype)]),
                                    cp.group)
            count = totals[1].clamp(min=1)
            out.loss = local / count + (totals[0] - local.detach()) / count  # value: group mean; grad: this share
            out.num_targets = totals[1].to(torch.int64)
            if return_per_token_nll:
                with torch.no_grad():
                    pred = gather_seq(nll.detach().view(B, e - s), cp.lengths, cp.group)  # [B, T]
        if return_per_token_nll:
            out.per_token_nll = torch.cat([pred.new_zeros(B, 1), pred[:, :-1]], dim=1)  # by scored token
            mask = labels != IGNORE_INDEX
            mask[:, 0] = False
            out.nll_mask = mask
        return out.to_tuple() if return_dict is False else out

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 1, cache=None) -> torch.Tensor:
        """Greedy decoding: prompt [B, T] -> [B, T + max_new_tokens], one token at a time through `cache`."""
        if self.cp is not None:
            raise NotImplementedError("generate runs in one process (this model is context-parallel)")
        cache = DynamicCache(config=self.config) if cache is None else cache
        ids, step = input_ids, input_ids
        for _ in range(max_new_tokens):
            step = self.lm_head(self.hidden(step, cache=cache)[:, -1]).float().argmax(-1, keepdim=True)  # [B, 1]
            ids = torch.cat([ids, step], dim=1)
        return ids

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """All logits [B, T, V] in float32 (small T only): logits[:, t] predicts token t+1."""
        return self.lm_head(self.hidden(input_ids, attention_mask, cache)).float()
