"""Streaming scoring: the second inference engine, walking a long sequence chunk by chunk.

    nll = score_streaming(model, input_ids, chunk_tokens=4096)      # input_ids [1, T] -> nll [T]

    scorer = StreamingScorer(model, total_len=T)                    # or feed pieces as they come
    parts = [scorer.step(input_ids[:, t:t + n]) for t, n in ...]    # each [B, n]

Same numbers as the parallel forward's `per_token_nll` (`Glm5NextCausalLM.forward`): element t
is -log p(x_t | x_<t) in float32, element 0 is 0 (nothing precedes it). The parallel forward is
the training path, so the agreement of the two is our log-prob parity (the reference run's
training-vs-vLLM comparison).

Per chunk of n tokens, upstream's `Glm5NextTextModel.forward` is replayed on the module's own
parameters (patched or not; only parameters are used):
    h = embed(x) expanded to hc_mult streams                      # [B, n, hc, D]
    per decoder layer, upstream's hyper-connections around attention and MLP (token-local):
        attention = `ops.kda.kda_layer_step` (carries `KDAState`: conv tail + [H, K, V] state)
                  | `ops.dsa.dsa_stream_step` (carries `DSACache`: latent rows [T, R], pool keys
                    [T / kpool, DI] and the incomplete pool's index keys; `shared` layers take the
                    previous layer's `DSASelection` for this chunk, as upstream's loop passes it)
        MLP / MoE = the module itself (token-local routing)
    hidden = norm(hc_head(h))                                     # [B, n, D]
The LM head + NLL run per chunk through `ops.loss.chunked_cross_entropy` (never all logits):
position t's hidden state scores token t+1, so a chunk's last hidden state is kept and scores the
first token of the next chunk when it arrives.

Memory: DSA caches O(T·(kv_lora + index_dim / kpool)) per DSA layer (preallocated when the total
length is known), KDA O(1) in T, activations O(chunk). Shapes: B batch, T tokens, n chunk tokens,
D model dim, hc hyper-connection streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from genome_lm.model.ops.dsa import DSACache, DSASelection, dsa_stream_step
from genome_lm.model.ops.kda import KDAState, kda_layer_step
from genome_lm.model.ops.loss import chunked_cross_entropy

__all__ = ["StreamingScorer", "score_streaming", "DEFAULT_CHUNK_TOKENS"]

DEFAULT_CHUNK_TOKENS = 4096


@dataclass
class StreamState:
    """Everything carried between chunks: per-layer KDAState / DSACache (None for a layer not yet
    run), tokens seen, and the last final hidden state [B, 1, D] (it scores the next token)."""

    layers: list = field(default_factory=list)
    length: int = 0
    last_hidden: torch.Tensor | None = None


def _hc_block(hc: nn.Module, norm: nn.Module, h: torch.Tensor, block) -> tuple[torch.Tensor, object]:
    """One hyper-connection-wrapped block, exactly as upstream's decoder layer writes it.

    h [B, n, hc, D]; block(x [B, n, D]) -> (y [B, n, D], extra). Returns (new h, extra).
    """
    dtype = h.dtype
    post, comb, x = hc(h)  # post [B, n, hc], comb [B, n, hc, hc], x [B, n, D]
    y, extra = block(norm(x))
    h = post.to(dtype).unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), h)
    return h, extra


class StreamingScorer:
    """Walk one batch of sequences chunk by chunk, carrying each layer's state (no gradients).

    Args:
        model: the causal LM from `genome_lm.model.build` (patched by `apply_long_context` or not).
        total_len: final sequence length if known: DSA caches are allocated once at that size and
            top-k ties resolve exactly as in one pass over the whole sequence. Give it for parity:
            indexer scores are sums of relus, so exact ties (often at 0) are common, and without
            it `torch.topk` sees a shorter row and may pick other tied pools (a different but
            equally valid selection; log-probs then differed by up to 0.07 on glm53-tiny).
        loss_chunk_tokens: tokens per LM-head chunk (default `model.loss_chunk_tokens`).
    """

    def __init__(self, model: nn.Module, total_len: int | None = None, loss_chunk_tokens: int | None = None):
        if not hasattr(model, "lm_head") or not hasattr(model, "model"):
            raise TypeError("StreamingScorer needs the causal LM from genome_lm.model.build (with lm_head)")
        self.model = model
        self.text = model.model  # upstream Glm5NextTextModel
        self.config = model.config
        self.total_len = total_len
        self.loss_chunk_tokens = loss_chunk_tokens or getattr(model, "loss_chunk_tokens", 2048)
        self.state = StreamState(layers=[None] * self.config.num_hidden_layers)

    @property
    def length(self) -> int:
        return self.state.length

    def cache_bytes(self) -> dict[str, int]:
        """Bytes held by the carried state: {"kda": ..., "dsa": ...} (allocated buffers)."""
        out = {"kda": 0, "dsa": 0}
        for s in self.state.layers:
            if isinstance(s, KDAState):
                out["kda"] += sum(t.numel() * t.element_size() for t in (s.conv_state, s.recurrent_state))
            elif isinstance(s, DSACache):
                out["dsa"] += sum(t.numel() * t.element_size()
                                  for t in (s.kv, s.pool_keys, s.tail_keys, s.tail_gate) if t is not None)
        return out

    def _new_dsa_cache(self, attn, h: torch.Tensor) -> DSACache | None:
        """Preallocated empty cache for a DSA layer when the total length is known, else None."""
        if self.total_len is None:
            return None
        B, L = h.shape[0], self.total_len
        kv = h.new_empty(B, L, attn.kv_lora_rank)
        pool_keys = None
        if attn.indexer is not None:
            ix = attn.indexer
            pool_keys = h.new_empty(B, max(L // ix.index_kpool, 1), ix.head_dim)
        return DSACache(kv=kv, length=0, pool_keys=pool_keys, total_len=L)

    @torch.no_grad()
    def hidden_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, n, D] of the next n tokens `input_ids` [B, n]; updates the state."""
        B, n = input_ids.shape
        if n == 0:
            raise ValueError("StreamingScorer: empty chunk")
        start = self.state.length
        if self.total_len is not None and start + n > self.total_len:
            raise ValueError(f"StreamingScorer: {start + n} tokens exceed total_len={self.total_len}")
        text, cfg = self.text, self.config
        emb = text.embed_tokens(input_ids)  # [B, n, D]
        h = emb.unsqueeze(2).expand(-1, -1, cfg.hc_mult, -1).contiguous()  # [B, n, hc, D]
        selection: DSASelection | None = None  # what upstream's loop passes as prev_topk_indices
        for i, layer in enumerate(text.layers[: cfg.num_hidden_layers]):
            attn, state = layer.self_attn, self.state.layers[i]
            if layer.block_type == "linear_attention":

                def block(x, attn=attn, state=state):
                    return kda_layer_step(attn, x, state)

                h, new_state = _hc_block(layer.attn_hc, layer.input_layernorm, h, block)
                selection = None
            else:
                cache = state if state is not None else self._new_dsa_cache(attn, h)

                def block(x, attn=attn, cache=cache, prev=selection):
                    out, sel, new_cache = dsa_stream_step(attn, x, cache, prev_selection=prev,
                                                          total_len=self.total_len)
                    return out, (sel, new_cache)

                h, (sel, new_state) = _hc_block(layer.attn_hc, layer.input_layernorm, h, block)
                selection = sel if attn.next_skip_topk else None
            self.state.layers[i] = new_state
            h, _ = _hc_block(layer.ffn_hc, layer.post_attention_layernorm, h, lambda x, m=layer.mlp: (m(x), None))
        self.state.length = start + n
        return text.norm(text.hc_head(h))  # [B, n, D]

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """NLL float32 [B, n] of the next n tokens: -log p(x_t | x_<t); the sequence's first token 0.

        The first token of this chunk is scored by the previous chunk's last hidden state.
        """
        B, n = input_ids.shape
        first = self.state.length == 0
        hidden = self.hidden_step(input_ids)  # [B, n, D]
        if first:  # nothing precedes token 0; hidden[:, t] scores token t + 1
            scoring, targets = hidden[:, :-1], input_ids[:, 1:]
        else:
            scoring, targets = torch.cat([self.state.last_hidden, hidden[:, :-1]], dim=1), input_ids
        self.state.last_hidden = hidden[:, -1:].clone()
        nll = torch.zeros(B, n, dtype=torch.float32, device=hidden.device)
        if targets.shape[1]:
            D = hidden.shape[-1]
            _, scored = chunked_cross_entropy(
                scoring.reshape(-1, D), self.model.lm_head.weight, targets.reshape(-1),
                chunk_tokens=self.loss_chunk_tokens, return_per_token=True,
            )
            nll[:, n - targets.shape[1]:] = scored.view(B, -1)
        return nll


@torch.no_grad()
def score_streaming(model: nn.Module, input_ids: torch.Tensor,
                    chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Per-token NLL float32 [T] of one sequence `input_ids` [1, T], in chunks of `chunk_tokens`.

    Same convention as the parallel forward's `per_token_nll[0]`: element t = -log p(x_t | x_<t),
    element 0 = 0. Peak memory: the DSA caches (O(T)) plus one chunk's activations.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"score_streaming takes input_ids [1, T], got {tuple(input_ids.shape)}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    T = input_ids.shape[1]
    input_ids = input_ids.to(model.lm_head.weight.device)
    scorer = StreamingScorer(model, total_len=T)
    out = torch.empty(T, dtype=torch.float32, device=input_ids.device)
    for t0 in range(0, T, chunk_tokens):
        t1 = min(t0 + chunk_tokens, T)
        out[t0:t1] = scorer.step(input_ids[:, t0:t1])[0]
    return out
