"""Streaming scoring, the second inference engine: a long sequence chunk by chunk, giving the parallel
forward's `per_token_nll` (their agreement is the log-prob parity, as training vs vLLM in the
reference run). Per chunk the model runs as upstream decodes, the layers' state in upstream's cache
(`LongKDA`: conv tail and recurrent state; `LongDSA`: latent rows and index keys); a chunk's last
hidden state scores the next chunk's first token. Memory: DSA O(T·(kv_lora + 2·index_dim)) per
layer, KDA O(1), activations O(chunk). Shapes: B batch, T tokens, n chunk tokens, D model dim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.loss import chunked_cross_entropy
from genome_lm.settings import STREAMING_CHUNK_TOKENS

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM


class StreamingCache(DynamicCache):
    """`DynamicCache` plus the final length, if known: `LongDSA` then scores top-k rows as one pass does."""

    def __init__(self, config, total_len: int | None = None):
        super().__init__(config=config)
        self.total_len = total_len


class StreamingScorer:
    """One batch of sequences chunk by chunk, each layer's state carried (no gradients; long-context
    classes installed if missing). Give `total_len` for parity: indexer scores (sums of relus) tie
    often, and a shorter row may pick other tied pools (log-probs then differed by up to 0.07)."""

    def __init__(self, model: Glm5NextCausalLM, total_len: int | None = None):
        if not hasattr(model, "lm_head") or not hasattr(model, "model"):
            raise TypeError("StreamingScorer needs the causal LM from genome_lm.model.build (with lm_head)")
        if not any(isinstance(m, LongDSA) for m in model.modules()):
            from genome_lm.model.patch import apply_long_context

            apply_long_context(model, ops=("kda", "dsa"))
        self.model = model
        self.loss_chunk_tokens: int = getattr(model, "loss_chunk_tokens", 2048)
        self.cache = StreamingCache(model.config, total_len)
        self.length = 0
        self.last_hidden: torch.Tensor | None = None  # [B, 1, D]: scores the next chunk's first token

    def cache_bytes(self) -> dict[str, int]:
        """Bytes held by the carried state, {"kda": ..., "dsa": ...}."""
        out = {"kda": 0, "dsa": 0}
        assert self.model.config.layer_types is not None  # the config fills it
        for layer, kind in zip(self.cache.layers, self.model.config.layer_types):
            values = [v for a in vars(layer).values() for v in (a.values() if isinstance(a, dict) else [a])]
            tensors = [t for t in values if isinstance(t, torch.Tensor)]  # KDA states sit in dicts
            out["kda" if kind == "linear_attention" else "dsa"] += sum(t.numel() * t.element_size() for t in tensors)
        return out

    @torch.no_grad()
    def hidden_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, n, D] of the next n tokens `input_ids` [B, n]; updates the state."""
        n = input_ids.shape[1]
        if n == 0:
            raise ValueError("StreamingScorer: empty chunk")
        if (total := self.cache.total_len) is not None and self.length + n > total:
            raise ValueError(f"StreamingScorer: {self.length + n} tokens exceed total_len={total}")
        hidden = self.model.model(input_ids=input_ids, cache=self.cache, use_cache=True).last_hidden_state
        self.length += n
        return hidden

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """NLL float32 [B, n] of the next n tokens: -log p(x_t | x_<t); the sequence's first token 0."""
        B, n = input_ids.shape
        hidden = self.hidden_step(input_ids)  # [B, n, D]
        if self.last_hidden is None:  # the first chunk: nothing precedes token 0; hidden[:, t] scores token t + 1
            scoring, targets = hidden[:, :-1], input_ids[:, 1:]
        else:
            scoring, targets = torch.cat([self.last_hidden, hidden[:, :-1]], dim=1), input_ids
        self.last_hidden = hidden[:, -1:].clone()
        nll = torch.zeros(B, n, dtype=torch.float32, device=hidden.device)
        if targets.shape[1]:
            _, scored = chunked_cross_entropy(
                scoring.flatten(0, 1), self.model.lm_head.weight, targets.reshape(-1),
                chunk_tokens=self.loss_chunk_tokens, return_per_token=True,
            )
            nll[:, n - targets.shape[1]:] = scored.view(B, -1)
        return nll


@torch.no_grad()
def score_streaming(model: Glm5NextCausalLM, input_ids: torch.Tensor,
                    chunk_tokens: int = STREAMING_CHUNK_TOKENS) -> torch.Tensor:
    """Per-token NLL float32 [T] of one sequence `input_ids` [1, T], in chunks of `chunk_tokens`."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"score_streaming takes input_ids [1, T], got {tuple(input_ids.shape)}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    T = input_ids.shape[1]
    input_ids = input_ids.to(model.lm_head.weight.device)
    scorer = StreamingScorer(model, total_len=T)
    return torch.cat([scorer.step(input_ids[:, t0:t0 + chunk_tokens])[0] for t0 in range(0, T, chunk_tokens)])
