"""Statistics of per-token NLL by context bucket, with a bootstrap over windows.

Tokens of one window are not independent (a repeat-rich window is hard everywhere), so the
resampling unit is the window: each bootstrap replicate draws W windows with replacement and
recomputes the token-weighted mean sum(NLL) / count over the drawn windows. All replicates
are computed at once as matrix products (replicate weights [R, W] @ per-window sums [W, M]).

Per-window sufficient statistics, for W windows, C = 2 repeat classes (0 unmasked, 1
repeat-masked) and K buckets plus one last column for "all scored tokens":
    sums   float64 [W, C, K+1]   sum of NLL (nats)
    counts int64   [W, C, K+1]   number of scored tokens
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from genome_lm.eval.buckets import assign

LN2 = math.log(2.0)
CLASSES = ("unmasked", "masked")
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
LEVEL = 0.95
_BLOCK = 256  # bootstrap replicates per matrix product (bounds memory at 256 x W weights)


def window_stats(nll: np.ndarray, contexts: np.ndarray, repeat: np.ndarray, edges: np.ndarray):
    """One window -> (sums float64 [C, K+1], counts int64 [C, K+1], context sums float64 [C, K+1]),
    from `nll` float32 [L] (NaN: not scored), `contexts` int64 [L] (preceding context of each
    token), `repeat` bool [L] (repeat-masked bases) and bucket `edges` int64 [K+1]."""
    K = len(edges) - 1
    scored = ~np.isnan(nll)
    bucket = assign(contexts, edges)
    bucket = np.where(bucket < 0, K, bucket)  # outside every bucket: counted in "all" only
    cell = (repeat.astype(np.int64) * (K + 1) + bucket)[scored]
    sums, ctx, counts = (np.bincount(cell, weights=w, minlength=2 * (K + 1)).reshape(2, K + 1)
                         for w in (nll[scored].astype(np.float64), contexts[scored].astype(np.float64), None))
    # the last column so far holds tokens outside the buckets; make it "all scored tokens"
    for arr in (sums, counts, ctx):
        arr[:, K] = arr.sum(axis=1)
    return sums, counts.astype(np.int64), ctx


def bootstrap_ci(statistic: Callable[..., np.ndarray], per_window: dict[str, np.ndarray],
                 resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED, level: float = LEVEL):
    """Percentile bootstrap CI over windows: `statistic(**sums)` maps the sums over the drawn windows of
    each `per_window` array [W, M] (each sum [r, M]) to the statistic [r, S]. Returns (low [S], high [S]),
    NaN where the statistic is undefined in most replicates."""
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(len(v), -1) for k, v in per_window.items()}
    W = len(next(iter(arrays.values())))  # >= 1: an eval has at least one window
    reps, rng, p = [], np.random.default_rng(seed), np.full(W, 1.0 / W)
    with np.errstate(divide="ignore", invalid="ignore"):
        for start in range(0, resamples, _BLOCK):  # weights [r, W]: how often each window is drawn
            w = rng.multinomial(W, p, size=min(_BLOCK, resamples - start)).astype(np.float64)
            reps.append(statistic(**{k: w @ v for k, v in arrays.items()}))
    reps = np.concatenate(reps)  # [R, S]
    alpha = (1.0 - level) / 2
    low, high = np.full(reps.shape[1], np.nan), np.full(reps.shape[1], np.nan)
    ok = np.isfinite(reps).mean(axis=0) >= 0.5
    if ok.any():
        low[ok], high[ok] = np.nanquantile(reps[:, ok], [alpha, 1 - alpha], axis=0)
    return low, high


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else NaN."""
    return np.divide(num, den, out=np.full(np.broadcast(num, den).shape, np.nan), where=den > 0)


def jfloat(x) -> float | None:
    """A JSON-safe float: None for NaN/inf."""
    x = float(x)
    return x if math.isfinite(x) else None


def summarize(sums: np.ndarray, counts: np.ndarray, ctx_sums: np.ndarray, edges: np.ndarray,
              resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> dict:
    """Per-window statistics [W, C, K+1] -> {"overall", "buckets", "repeat": {"masked", "unmasked"}}.

    `ctx_sums` [C, K+1] (summed over windows) gives each bucket's mean context.
    """
    def table(s: np.ndarray, n: np.ndarray, c: np.ndarray) -> dict:  # s, n [W, K+1]; c [K+1]
        total_s, total_n = s.sum(axis=0), n.sum(axis=0)
        mean = ratio(total_s, total_n)
        low, high = bootstrap_ci(lambda s, n: ratio(s, n), {"s": s, "n": n}, resamples, seed)
        ctx_mean = ratio(c, total_n)
        n_windows = (n > 0).sum(axis=0)

        def entry(k: int) -> dict:
            return {"n_tokens": int(total_n[k]), "n_windows": int(n_windows[k]), "mean_nll": jfloat(mean[k]),
                    "bits_per_base": jfloat(mean[k] / LN2), "ci_low": jfloat(low[k]), "ci_high": jfloat(high[k])}

        K = len(edges) - 1
        buckets = [{"lo": int(edges[k]), "hi": int(edges[k + 1]), **entry(k), "context_mean": jfloat(ctx_mean[k])}
                   for k in range(K)]
        return {"overall": entry(K), "buckets": buckets}

    result = table(sums.sum(axis=1), counts.sum(axis=1), ctx_sums.sum(axis=0))
    result["repeat"] = {name: table(sums[:, c], counts[:, c], ctx_sums[c]) for c, name in enumerate(CLASSES)}
    return result
