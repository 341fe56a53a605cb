"""Score continuations of one shared prefix: the prefix's state is computed once, then each continuation
is scored from a snapshot of it.

    logps = score_continuations(model, prefix, [ref_cont, alt_cont])   # model ids [L], [n_i] -> log-probs [n_i]

The prefix runs through `StreamingScorer` (KDA conv tails and recurrent states, DSA latent rows and
index keys, in upstream's cache). `snapshot` clones the KDA states (constant size) and remembers the
DSA cache length; `restore` copies the KDA states back and crops the DSA layers (`DynamicIndexedLayer.crop`:
latent rows and index keys), so every continuation sees exactly the prefix's state.

Exactness: each continuation's log-probs equal scoring prefix + continuation from scratch
(`score_streaming`, the parallel forward's parity). The DSA indexer's top-k row has total_len // kpool
pools (`StreamingCache`), so continuations share one prefix pass only when their totals give the same
row; others (indels of another length) get their own pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

import numpy as np
import torch

from genome_lm.model.streaming import StreamingScorer
from genome_lm.settings import STREAMING_CHUNK_TOKENS

__all__ = ["score_continuations", "snapshot", "restore"]


def _layers(scorer: StreamingScorer) -> list[Any]:
    """The cache's layers: upstream's linear-attention layers (KDA) and indexed DynamicLayers (DSA)."""
    return list(scorer.cache.layers)


def snapshot(scorer: StreamingScorer) -> tuple:
    """What `restore` needs to bring `scorer` back to this point: per layer, clones of a KDA layer's conv
    and recurrent states (and token count), or a DSA layer's cached length."""
    layers: list[Any] = []
    for layer in _layers(scorer):
        if hasattr(layer, "conv_states"):
            layers.append(({i: t.clone() for i, t in layer.conv_states.items() if t is not None},
                           {i: t.clone() for i, t in layer.recurrent_states.items() if t is not None},
                           layer.cumulative_length_linear.clone()))
        else:
            layers.append(layer.get_seq_length())
    return scorer.length, scorer.last_hidden, layers


def restore(scorer: StreamingScorer, snap: tuple) -> None:
    """Bring `scorer` back to `snap` (in place: the KDA states keep their addresses)."""
    scorer.length, scorer.last_hidden, layers = snap
    for layer, saved in zip(_layers(scorer), layers):
        if isinstance(saved, int):
            layer.crop(saved - layer.get_seq_length())  # a negative count: the rows after the snapshot
            continue
        conv, recurrent, count = saved
        for i, t in conv.items():
            layer.conv_states[i].copy_(t)
        for i, t in recurrent.items():
            layer.recurrent_states[i].copy_(t)
        layer.cumulative_length_linear.copy_(count)


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
        snap = snapshot(scorer)
        for k, i in enumerate(members):
            if k:
                restore(scorer, snap)
            out[i] = _logp(scorer, conts[i], chunk_tokens, device)
    return out
