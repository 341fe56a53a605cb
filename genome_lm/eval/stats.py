"""Statistics of per-token NLL by context bucket, with a bootstrap over windows.

Tokens of one window are not independent (a repeat-rich window is hard everywhere), so the
resampling unit is the window: each bootstrap replicate draws W windows with replacement and
recomputes the token-weighted mean sum(NLL) / count over the drawn windows. All replicates
are computed at once as matrix products (replicate weights [R, W] @ per-window sums [W, M]).

Per-window sufficient statistics, for W windows, C = 2 classes of a stratum (0: mask False, 1:
mask True; the repeat classes unmasked / repeat-masked by default) and K buckets plus one last
column for "all scored tokens":
    sums   float64 [W, C, K+1]   sum of NLL (nats)
    counts int64   [W, C, K+1]   number of scored tokens
With several strata (`strata.py`: repeat, leakage, annotations) they stack to [W, S, C, K+1].
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from genome_lm.eval.buckets import assign
from genome_lm.eval.strata import REPEAT, Stratum, masks, place

LN2 = math.log(2.0)
CLASSES = REPEAT.labels  # ("unmasked", "masked")
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
LEVEL = 0.95
_BLOCK = 256  # bootstrap replicates per matrix product (bounds memory at 256 x W weights)


def window_stats(nll: np.ndarray, contexts: np.ndarray, repeat: np.ndarray, edges: np.ndarray):
    """One window -> (sums float64 [C, K+1], counts int64 [C, K+1], context sums float64 [C, K+1]),
    from `nll` float32 [L] (NaN: not scored), `contexts` int64 [L] (preceding context of each
    token), `repeat` bool [L] (the class of each token: repeat-masked bases, or any stratum's
    mask) and bucket `edges` int64 [K+1]."""
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


def strata_stats(nll: np.ndarray, contexts: np.ndarray, masks: list[np.ndarray], edges: np.ndarray):
    """`window_stats` for each of S masks bool [L] -> (sums [S, C, K+1], counts [S, C, K+1], ctx [S, C, K+1])."""
    parts = [window_stats(nll, contexts, m, edges) for m in masks]
    return tuple(np.stack([p[i] for p in parts]) for i in range(3))


class StrataAccumulator:
    """Per-window statistics of W windows over S strata: `sums`, `counts` [W, S, C, K+1] and the
    summed contexts `ctx` [S, C, K+1], filled window by window (`add`), read by `summarize`."""

    def __init__(self, n_windows: int, strata: list[Stratum], edges: np.ndarray):
        self.strata, self.edges = list(strata), edges
        shape = (n_windows, len(self.strata), 2, len(edges))
        self.sums, self.counts = np.zeros(shape), np.zeros(shape, dtype=np.int64)
        self.ctx = np.zeros(shape[1:])

    def add(self, i: int, rec: dict, contexts: np.ndarray, nll: np.ndarray | None = None) -> None:
        """Window i: `rec` holds the masks (`strata.mask_of`) and, unless given, `nll` float32 [L]."""
        s, n, c = strata_stats(rec["nll"] if nll is None else nll, contexts, masks(rec, self.strata), self.edges)
        self.sums[i] += s
        self.counts[i] += n
        self.ctx += c


def bootstrap_ci(statistic: Callable[..., np.ndarray], per_window: dict[str, np.ndarray],
                 resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED, level: float = LEVEL):
    """Percentile bootstrap CI over windows: `statistic(**sums)` maps the sums over the drawn windows of
    each `per_window` array [W, M] (each sum [r, M]) to the statistic [r, S]. Returns (low [S], high [S]),
    NaN where the statistic is undefined in most replicates, and where fewer than two windows define it
    on their own (one window, or a bucket that only one window reaches): resampling one window has no
    spread to show, and a zero-width interval would claim a precision the data do not have."""
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(len(v), -1) for k, v in per_window.items()}
    W = len(next(iter(arrays.values())))  # >= 1: an eval has at least one window
    reps: list[np.ndarray] = []
    rng, p = np.random.default_rng(seed), np.full(W, 1.0 / W)
    with np.errstate(divide="ignore", invalid="ignore"):
        defined_by = np.isfinite(statistic(**arrays)).sum(axis=0)  # [S]: windows whose own statistic is finite
        for start in range(0, resamples, _BLOCK):  # weights [r, W]: how often each window is drawn
            w = rng.multinomial(W, p, size=min(_BLOCK, resamples - start)).astype(np.float64)
            reps.append(statistic(**{k: w @ v for k, v in arrays.items()}))
    return _percentile_ci(np.concatenate(reps), defined_by >= 2, level)  # [R, S]


def _percentile_ci(reps: np.ndarray, usable: np.ndarray | bool, level: float):
    """(low [S], high [S]) percentiles of bootstrap replicates `reps` [R, S]; NaN where not `usable` or
    where the statistic is undefined in most replicates."""
    alpha = (1.0 - level) / 2
    low, high = np.full(reps.shape[1], np.nan), np.full(reps.shape[1], np.nan)
    ok = (np.isfinite(reps).mean(axis=0) >= 0.5) & usable
    if ok.any():
        low[ok], high[ok] = np.nanquantile(reps[:, ok], [alpha, 1 - alpha], axis=0)
    return low, high


def two_level_ci(statistic: Callable[..., np.ndarray], per_cell: dict[str, np.ndarray],
                 resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED, level: float = LEVEL):
    """Percentile CI of a two-level bootstrap, over training runs and then windows: each resample draws
    R replicates (models trained alike but for their seeds) with replacement, then W windows with
    replacement, the same windows for every drawn replicate. `statistic(**sums)` maps the sums over the
    drawn (replicate, window) cells of each `per_cell` array [R, W, M] (each sum [r, M]) to [r, S].
    With one replicate only the windows are drawn, with the same draws as `bootstrap_ci`, so the CI is
    the window bootstrap's. Returns (low [S], high [S]); NaN everywhere with fewer than 2 windows, and
    where the statistic is undefined in most resamples."""
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(v.shape[0], v.shape[1], -1) for k, v in per_cell.items()}
    R, W = next(iter(arrays.values())).shape[:2]
    with np.errstate(divide="ignore", invalid="ignore"):
        S = statistic(**{k: v.sum(axis=(0, 1))[None] for k, v in arrays.items()}).shape[1]
        if W < 2:
            return np.full(S, np.nan), np.full(S, np.nan)
        reps, rng = [], np.random.default_rng(seed)
        for start in range(0, resamples, _BLOCK):
            b = min(_BLOCK, resamples - start)
            w = rng.multinomial(W, np.full(W, 1.0 / W), size=b).astype(np.float64)  # [b, W]
            u = rng.multinomial(R, np.full(R, 1.0 / R), size=b).astype(np.float64) if R > 1 else np.ones((b, 1))
            reps.append(statistic(**{k: np.einsum("br,rwm,bw->bm", u, v, w) for k, v in arrays.items()}))
    return _percentile_ci(np.concatenate(reps), True, level)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else NaN."""
    return np.divide(num, den, out=np.full(np.broadcast(num, den).shape, np.nan), where=den > 0)


def jfloat(x) -> float | None:
    """A JSON-safe float: None for NaN/inf."""
    x = float(x)
    return x if math.isfinite(x) else None


def bucket_table(s: np.ndarray, n: np.ndarray, c: np.ndarray, edges: np.ndarray,
                 resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> dict:
    """{"overall": entry, "buckets": [entry + lo, hi, context_mean]} from per-window NLL sums `s` and
    counts `n` [W, K+1] and summed contexts `c` [K+1]; entry = n_tokens, n_windows, mean_nll,
    bits_per_base, ci_low, ci_high (nats; window bootstrap)."""
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


def summarize(sums: np.ndarray, counts: np.ndarray, ctx_sums: np.ndarray, edges: np.ndarray,
              resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
              strata: list[Stratum] | None = None) -> dict:
    """Per-window statistics -> {"overall", "buckets", "repeat": {"unmasked", "masked"}, ...}.

    Either [W, C, K+1] (the repeat classes; `ctx_sums` [C, K+1]) or, with `strata` [S], [W, S, C, K+1]
    (`ctx_sums` [S, C, K+1]); each stratum's classes get a `bucket_table`, filed by `strata.place`
    (`"leakage": {...}`, `"annotations": {NAME: {"out", "in"}}`). `ctx_sums` (summed over windows)
    gives each bucket's mean context.
    """
    if strata is None:
        sums, counts, ctx_sums, strata = sums[:, None], counts[:, None], ctx_sums[None], [REPEAT]

    def table(s, n, c):
        return bucket_table(s, n, c, edges, resamples, seed)

    result = table(sums[:, 0].sum(axis=1), counts[:, 0].sum(axis=1), ctx_sums[0].sum(axis=0))
    per = [{label: table(sums[:, i, c], counts[:, i, c], ctx_sums[i, c]) for c, label in enumerate(st.labels)}
           for i, st in enumerate(strata)]
    return place(result, strata, per)
