"""Background sequence as a Markov chain of its own per isochore (`synth --set markov_order=K`).

Each isochore draws its own order-K transition table and its bases follow that chain. The table
is never written anywhere: a model can only learn it from the sequence before the token it
predicts, and the more of that sequence it reads the better its estimate. Two kinds of table
(`markov_rows`):

- "dirichlet": every row (the next base given the K bases before it) from a symmetric
  Dirichlet(alpha): 4^K * 3 free parameters; a Bayes-optimal reader's excess loss falls about as
  4^K * 3 / (2 L) nats per base after L bases of the isochore.
- "additive": log P(next = b | x_{t-K}..x_{t-1}) = sum_i A[i, x_{t-i}, b] + const, A ~ N(0, scale^2)
  per isochore: K * 4 * 3 free parameters, each a linear function of the one-hot preceding bases,
  the regression that a linear-attention (delta rule) layer estimates in context. This is the
  demo genome's background (docs/findings.md, "What an ideal reader gains").
"""

from __future__ import annotations

import bisect

import numpy as np


def dirichlet_rows(rng: np.random.Generator, order: int, alpha: float) -> np.ndarray:
    """float64 [4^order, 4]: each row a Dirichlet(alpha) draw."""
    return rng.dirichlet(np.full(4, alpha), size=4**order)


def additive_rows(rng: np.random.Generator, order: int, scale: float) -> np.ndarray:
    """float64 [4^order, 4]: row c (base at t - 1 - i = bits 2i..2i+1 of c) = softmax over b of
    sum_i A[i, base_i(c), b], A float64 [order, 4, 4] ~ N(0, scale^2)."""
    a = rng.normal(0.0, scale, size=(order, 4, 4))
    ctx = np.arange(4**order)
    logits = sum(a[i][(ctx >> (2 * i)) & 3] for i in range(order))
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def markov_bases(rng: np.random.Generator, seg_len: np.ndarray, order: int, n: int, rows) -> np.ndarray:
    """n base codes (0 A, 1 C, 2 G, 3 T; uint8): consecutive segments of `seg_len` bases (the
    last cut at n), each an order-`order` Markov chain with its own table `rows(rng)` (float
    [4^order, 4], rows summing to 1; row c = the K preceding bases, the base at t - 1 in c's
    lowest two bits); a segment's first bases continue from the bases before it."""
    out = np.empty(n, dtype=np.uint8)
    mask = 4**order - 1
    state, pos = 0, 0
    for length in np.ceil(seg_len).astype(int):
        if pos >= n:
            break
        m = min(int(length), n - pos)
        cum = np.cumsum(rows(rng), axis=1)
        cum[:, 3] = 1.0  # no draw falls past the last base through rounding
        table = cum.tolist()
        u = rng.random(m).tolist()
        seg = [0] * m
        for i in range(m):
            b = bisect.bisect_right(table[state], u[i])
            seg[i] = b
            state = ((state << 2) | b) & mask
        out[pos : pos + m] = seg
        pos += m
    return out
