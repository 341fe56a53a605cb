"""`eval --parity`: the parallel (training) forward vs the streaming engine on the same tokens, max and
mean |delta log-prob| = |NLL_a - NLL_b| (nats) per context bucket and overall, over tokens both scored."""

from __future__ import annotations

import numpy as np

from genome_lm.eval.buckets import assign
from genome_lm.eval.stats import jfloat


class ParityTable:
    """|delta log-prob| by bucket over windows: columns 0..K-1 the buckets of `edges` int64 [K+1], column K
    the tokens outside every bucket."""

    def __init__(self, edges: np.ndarray):
        self.edges = edges
        K = len(edges) - 1
        self.n = np.zeros(K + 1, dtype=np.int64)
        self.sum = np.zeros(K + 1)
        self.max = np.zeros(K + 1)

    def add(self, nll_a: np.ndarray, nll_b: np.ndarray, contexts: np.ndarray) -> None:
        """nll_a, nll_b float32 [L] (NaN = not scored), contexts int64 [L]."""
        K = len(self.edges) - 1
        both = ~(np.isnan(nll_a) | np.isnan(nll_b))
        diff = np.abs(nll_a[both].astype(np.float64) - nll_b[both])
        bucket = assign(contexts[both], self.edges)
        bucket = np.where(bucket < 0, K, bucket)
        self.n += np.bincount(bucket, minlength=K + 1)
        self.sum += np.bincount(bucket, weights=diff, minlength=K + 1)
        np.maximum.at(self.max, bucket, diff)

    def result(self, engines: list[str]) -> dict:
        K = len(self.edges) - 1

        def entry(n, s, m) -> dict:
            return {"n_tokens": int(n), "max_abs_diff": jfloat(m) if n else None,
                    "mean_abs_diff": jfloat(s / n) if n else None}

        return {
            "engines": engines,
            "quantity": "|delta log-prob| per token, nats",
            "overall": entry(self.n.sum(), self.sum.sum(), self.max.max()),
            "buckets": [{"lo": int(self.edges[k]), "hi": int(self.edges[k + 1]),
                         **entry(self.n[k], self.sum[k], self.max[k])} for k in range(K)],
        }
