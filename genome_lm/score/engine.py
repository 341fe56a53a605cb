"""The streaming scorer's two uses: per-base log-probs and embeddings of one sequence, chunk by chunk
(`stream`, for `genome-lm score`), and continuations of one shared prefix scored from a snapshot of its
state (`score_continuations`, for `genome-lm variants`). Exactness and cost: docs/score.md.

    for c in stream(model, ids, cols, chunk=4096, layers=[0, 5]):    # ids int64 [T] (model ids)
        c.start, c.logp, c.logp_acgt, c.embeddings                   # [n], [n, 4], {layer: [n, D]}
    logps = score_continuations(model, prefix, [ref_cont, alt_cont])   # model ids [L], [n_i] -> log-probs [n_i]

Per position t: `logp[t]` = log p(x_t | x_<t) (natural log, float32; NaN at t = 0), `logp_acgt[t]` = the
log-softmax over the whole vocabulary at t, columns A, C, G, T. Embeddings: the residual stream after each
named decoder layer, the mean over the hyper-connection streams ([n, hc, D] -> [n, D]).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import numpy as np
import torch

from genome_lm.model.streaming import StreamingScorer
from genome_lm.settings import STREAMING_CHUNK_TOKENS


@dataclass
class Chunk:
    start: int  # position of the chunk's first token in the sequence
    logp: torch.Tensor  # [n] float32
    logp_acgt: torch.Tensor  # [n, 4] float32
    embeddings: dict[int, torch.Tensor]  # layer -> [n, D] float32

    def cpu(self) -> Chunk:
        embeddings = {k: v.cpu() for k, v in self.embeddings.items()}
        return Chunk(self.start, self.logp.cpu(), self.logp_acgt.cpu(), embeddings)


@contextlib.contextmanager
def captured(model, layers: list[int]) -> Iterator[dict[int, torch.Tensor]]:
    """While open, `out[layer]` holds the residual stream [B, n, D] float32 after each of `layers` in the
    latest forward (forward hooks on `model.model.layers`)."""
    out: dict[int, torch.Tensor] = {}

    def hook(layer: int):
        def keep(module, args, output) -> None:
            hidden = output[0] if isinstance(output, tuple) else output  # [B, n, hc, D]
            out[layer] = hidden.float().mean(dim=2)
        return keep

    handles = [model.model.layers[i].register_forward_hook(hook(i)) for i in layers]
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def log_probs(hidden: torch.Tensor, weight: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor,
              chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [m, D] (position t scores token t + 1), LM head `weight` [V, D], `cols` [4] the model ids of
    A, C, G, T, `targets` [m] -> (log p(target) [m], log p(A, C, G, T) [m, 4]), float32, logits in blocks
    of `chunk_tokens` rows (as the chunked loss computes them)."""
    logp = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    acgt = torch.empty(hidden.shape[0], 4, dtype=torch.float32, device=hidden.device)
    for s in range(0, hidden.shape[0], chunk_tokens):
        logits = (hidden[s : s + chunk_tokens] @ weight.t()).float()  # [C, V]
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [C, 1]
        logp[s : s + chunk_tokens] = (logits.gather(1, targets[s : s + chunk_tokens, None]) - lse)[:, 0]
        acgt[s : s + chunk_tokens] = logits[:, cols] - lse
    return logp, acgt


def head_weight(model) -> torch.Tensor:
    """The LM head's weight [V, D] whole: gathered once from its FSDP2 shards (a collective: every rank)."""
    weight = model.lm_head.weight
    return weight.full_tensor() if hasattr(weight, "full_tensor") else weight


@torch.no_grad()
def stream(model, ids: torch.Tensor, cols: torch.Tensor, chunk: int, layers: Sequence[int] = (),
           weight: torch.Tensor | None = None) -> Iterator[Chunk]:
    """The `Chunk`s of sequence `ids` int64 [T] in model ids, `chunk` tokens each (the last may be shorter);
    `weight`: the LM head's (`head_weight`)."""
    T = ids.shape[0]
    scorer = StreamingScorer(model, total_len=T)
    weight, cols = head_weight(model) if weight is None else weight, cols.to(model.device)
    last: torch.Tensor | None = None  # [1, D]: the previous chunk's last hidden state scores this chunk's first token
    with captured(model, list(layers)) as out:
        for t0 in range(0, T, chunk):
            piece = ids[t0 : t0 + chunk].to(model.device)  # [n]
            hidden = scorer.hidden_step(piece[None])[0]  # [n, D]
            scoring = hidden[:-1] if last is None else torch.cat([last, hidden[:-1]])  # [n or n - 1, D]
            last = hidden[-1:]
            logp, acgt = log_probs(scoring, weight, cols, piece[len(piece) - len(scoring):], scorer.loss_chunk_tokens)
            if t0 == 0:  # NaN rows for token 0: nothing precedes it
                logp = torch.cat([logp.new_full((1,), float("nan")), logp])
                acgt = torch.cat([acgt.new_full((1, 4), float("nan")), acgt])
            yield Chunk(t0, logp, acgt, {i: out[i][0] for i in layers})


@torch.no_grad()
def whole(model, ids: torch.Tensor, cols: torch.Tensor, chunk: int, layers: Sequence[int], weight: torch.Tensor
          ) -> Iterator[Chunk]:
    """The same `Chunk`s from one parallel forward over all of `ids` [T]: the path of a context-parallel
    model (`model.cp`), whose CP group splits the sequence into slabs; each rank scores its slab (the previous
    slab's last hidden state scores its first token), and the rows and embeddings are gathered."""
    from genome_lm.model.cp import gather_seq

    ids = ids.to(model.device)
    with captured(model, list(layers)) as out:
        hidden = model(ids[None], return_hidden=True).hidden_states[0]  # [T_r, D]: this rank's slab
    cp = model.cp
    s = cp.start if cp is not None else 0
    if cp is not None and cp.size > 1:
        lasts = gather_seq(hidden[None, -1:], [1] * cp.size, cp.group)[0]  # [cp, D]: each slab's last
        hidden = hidden if s == 0 else torch.cat([lasts[cp.rank - 1 : cp.rank], hidden])  # [T_r (+ 1), D]
    logp, acgt = log_probs(hidden[:-1], weight, cols.to(ids.device), ids[max(s, 1) : s + len(hidden) - (s > 0)],
                           model.loss_chunk_tokens)
    rows = torch.cat([logp[:, None], acgt], dim=1)  # [T_r (- 1), 5]
    rows = torch.cat([rows.new_full((1, 5), float("nan")), rows]) if s == 0 else rows  # nothing precedes token 0
    if cp is not None and cp.size > 1:
        rows = gather_seq(rows[None], cp.lengths, cp.group)[0]  # [T, 5]
        out = {i: gather_seq(out[i], cp.lengths, cp.group) for i in layers}
    for t0 in range(0, ids.shape[0], chunk):
        yield Chunk(t0, rows[t0 : t0 + chunk, 0], rows[t0 : t0 + chunk, 1:], {i: out[i][0, t0 : t0 + chunk]
                                                                             for i in layers})


def snapshot(scorer: StreamingScorer) -> Callable[[], None]:
    """A function that brings `scorer` back to this point, in place (the KDA states keep their addresses): per
    cache layer, clones of a KDA layer's conv and recurrent states and token count, or a DSA layer's length."""
    length, last, layers = scorer.length, scorer.last_hidden, list[Any](scorer.cache.layers)
    saved = [(layer, ({i: t.clone() for i, t in layer.conv_states.items() if t is not None},
                      {i: t.clone() for i, t in layer.recurrent_states.items() if t is not None},
                      layer.cumulative_length_linear.clone()))
             if hasattr(layer, "conv_states") else (layer, layer.get_seq_length()) for layer in layers]

    def restore() -> None:
        scorer.length, scorer.last_hidden = length, last
        for layer, state in saved:
            if isinstance(state, int):
                layer.crop(state - layer.get_seq_length())  # a negative count: the rows after the snapshot
                continue
            for states, kept in zip((layer.conv_states, layer.recurrent_states), state):
                for i, t in kept.items():
                    states[i].copy_(t)
            layer.cumulative_length_linear.copy_(state[2])

    return restore


def _logp(scorer: StreamingScorer, ids: np.ndarray, chunk: int, device) -> np.ndarray:
    """Log-probs float32 [n] of the next n tokens `ids`; NaN for a sequence's first token."""
    out = []
    for t0 in range(0, len(ids), chunk):
        first = scorer.length == 0
        x = torch.as_tensor(ids[t0:t0 + chunk], dtype=torch.long, device=device)[None]
        lp = -scorer.step(x)[0].float().cpu().numpy()
        if first:
            lp[0] = np.nan
        out.append(lp)
    return np.concatenate(out)


def score_continuations(model, prefix: np.ndarray, conts: Sequence[np.ndarray],
                        chunk_tokens: int = STREAMING_CHUNK_TOKENS) -> list[np.ndarray]:
    """Log-probs float32 [n_i] of each continuation `conts[i]` (model ids) given `prefix` (model ids [L],
    possibly empty); the prefix runs once per group of continuations with the same DSA top-k row."""
    device = model.lm_head.weight.device
    kpool = int(getattr(model.config, "index_kpool", 1) or 1)
    L = len(prefix)
    out: list[np.ndarray] = [np.empty(0, np.float32)] * len(conts)

    def row(i: int) -> int:  # without a prefix there is no state to share: each continuation alone
        return (L + len(conts[i])) // kpool if L else -1 - i

    for _, group in groupby(sorted(range(len(conts)), key=row), key=row):
        members = list(group)
        scorer = StreamingScorer(model, total_len=L + max(len(conts[i]) for i in members))
        if L:
            _logp(scorer, prefix, chunk_tokens, device)
        restore = snapshot(scorer)
        for k, i in enumerate(members):
            if k:
                restore()
            out[i] = _logp(scorer, conts[i], chunk_tokens, device)
    return out
