"""Per-token NLL of one window, scored in consecutive pieces of at most `seq_len` tokens, each an
independent forward (context restarts at every piece: `stats.contexts_of`). As in training
(`train.data`), N bases, shard ids the token map lacks and the first token of a piece are not scored
(NaN). Engines: "parallel" (the training forward's chunked per-token NLL) and "streaming"
(`model.streaming.score_streaming`, state carried from chunk to chunk). `eval --parity` scores with both
and reports |delta log-prob| = |NLL_a - NLL_b| (nats) over the tokens both scored (`ParityTable`)."""

from __future__ import annotations

import numpy as np
import torch

from genome_lm.eval.stats import assign, by_bucket, jfloat
from genome_lm.genome.tokenizer import IGNORE_INDEX, N_ID
from genome_lm.settings import STREAMING_CHUNK_TOKENS

ENGINES = ("parallel", "streaming")


def piece_inputs(piece: np.ndarray, lut: np.ndarray, n_known: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shard ids uint8 [T] -> (input_ids, labels) int64 [1, T] of the model (`lut` [256]); ids >= `n_known`
    (not in the token map) are fed as N and, like N, get label -100."""
    ids = piece.astype(np.int64)
    known = ids < n_known
    ids = np.where(known, ids, N_ID)
    model_ids = lut[ids]
    labels = np.where(known & (ids != N_ID), model_ids, IGNORE_INDEX)
    return torch.from_numpy(model_ids)[None], torch.from_numpy(labels)[None]


@torch.no_grad()
def score_piece(model, input_ids: torch.Tensor, labels: torch.Tensor, engine: str = "parallel",
                chunk_tokens: int = STREAMING_CHUNK_TOKENS) -> np.ndarray:
    """NLL float32 [T] of one piece (input_ids, labels [1, T]); NaN where not scored."""
    input_ids = input_ids.to(model.device)
    if engine == "parallel":
        out = model(input_ids, labels=labels.to(model.device), return_per_token_nll=True)
        nll = out.per_token_nll[0].float().cpu().numpy()
        mask = out.nll_mask[0].cpu().numpy()
    else:  # "streaming" (EvalConfig.engine allows no other)
        from genome_lm.model.streaming import score_streaming

        nll = score_streaming(model, input_ids, chunk_tokens).float().reshape(-1).cpu().numpy()
        mask = labels[0].numpy() != IGNORE_INDEX
        mask[0] = False
    return np.where(mask, nll, np.nan).astype(np.float32)


def score_window(model, tokens: np.ndarray, lut: np.ndarray, n_known: int, seq_len: int,
                 engine: str = "parallel", chunk_tokens: int = STREAMING_CHUNK_TOKENS) -> np.ndarray:
    """NLL float32 [L] of a window of shard ids uint8 [L], scored in pieces of `seq_len`."""
    out = np.empty(len(tokens), dtype=np.float32)
    for start in range(0, len(tokens), seq_len):
        piece = tokens[start : start + seq_len]
        ids, labels = piece_inputs(piece, lut, n_known)
        out[start : start + len(piece)] = score_piece(model, ids, labels, engine, chunk_tokens)
    return out


class ParityTable:
    """|delta log-prob| by bucket over windows: columns 0..K-1 the buckets of `edges` int64 [K+1], column K
    the tokens outside every bucket."""

    def __init__(self, edges: np.ndarray):
        self.edges, self.n = edges, np.zeros(len(edges), dtype=np.int64)  # [K+1]
        self.sum, self.max = np.zeros(len(edges)), np.zeros(len(edges))

    def add(self, nll_a: np.ndarray, nll_b: np.ndarray, contexts: np.ndarray) -> None:
        """nll_a, nll_b float32 [L] (NaN = not scored), contexts int64 [L]."""
        K = len(self.edges) - 1
        both = ~(np.isnan(nll_a) | np.isnan(nll_b))
        diff = np.abs(nll_a[both].astype(np.float64) - nll_b[both])
        bucket = assign(contexts[both], self.edges, outside=K)
        self.n += np.bincount(bucket, minlength=K + 1)
        self.sum += np.bincount(bucket, weights=diff, minlength=K + 1)
        np.maximum.at(self.max, bucket, diff)

    def result(self, engines: list[str]) -> dict:
        n, s = (np.append(x[:-1], x.sum()) for x in (self.n, self.sum))  # the buckets, then all tokens
        m = np.append(self.max[:-1], self.max.max())

        def entry(k: int) -> dict:
            return {"n_tokens": int(n[k]), "max_abs_diff": jfloat(m[k]) if n[k] else None,
                    "mean_abs_diff": jfloat(s[k] / n[k]) if n[k] else None}

        return {"engines": engines, "quantity": "|delta log-prob| per token, nats", **by_bucket(self.edges, entry)}
