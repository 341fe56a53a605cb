"""Statistics of per-token NLL by context bucket, with a bootstrap over windows.

Strata: binary splits of the scored tokens by a mask bool [L] in token order, each summarised like the
whole eval: repeat (soft-mask), leakage (`prepare --leakage-k`), one per `--annotate` BED file.

A token's context is the tokens before it that the model saw (its position in the scored piece,
`scoring.py`); bucket k of `edges` [K+1] is [edges[k], edges[k+1]).

Tokens of one window are not independent (a repeat-rich window is hard everywhere), so the
resampling unit is the window: each replicate draws W windows with replacement and recomputes the
token-weighted mean sum(NLL) / count, all replicates at once as matrix products (weights [R, W] @
per-window sums [W, M]). Per-window sums (float64, nats) and counts (int64) are [W, S, C, K+1]: S
strata, C = 2 classes (mask False, True), K buckets plus a last column of all tokens.

`eval --strands both` also scores each window as its reverse complement (token j' the complement of
forward token L-1-j'; masks reversed; contexts: positions in the reverse row). summary.json `strands`
(docs/eval.md): `forward`, `reverse`, `average` (a window's strands bootstrapped together) and
`agreement` (the same base scored from each side).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from genome_lm.errors import GenomeLMError

LN2 = math.log(2.0)
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
LEVEL = 0.95
_BLOCK = 256  # bootstrap replicates per matrix product (bounds memory at 256 x W weights)
FLIP: dict[str | None, str] = {"+": "-", "-": "+"}
_MOMENTS = 7  # n, sum f, sum r, sum f^2, sum r^2, sum f r, sum |f - r|


@dataclass(frozen=True)
class Stratum:
    section: str  # key in summary.json / compare.json: "repeat", "leakage" or "annotations"
    name: str | None  # the annotation's NAME (its key under "annotations"); None for repeat, leakage
    labels: tuple[str, str]  # names of class 0 (mask False) and class 1 (mask True)

    @property
    def key(self) -> str:
        return self.section if self.name is None else f"{self.section}:{self.name}"


REPEAT = Stratum("repeat", None, ("unmasked", "masked"))
LEAKAGE = Stratum("leakage", None, ("unmasked", "masked"))


def annotation(name: str) -> Stratum:
    return Stratum("annotations", name, ("out", "in"))


def strata_of(rec: dict) -> list[Stratum]:
    """The strata a window record carries."""
    return [REPEAT] + ([LEAKAGE] if rec.get("leakage") is not None else []) + \
        [annotation(n) for n in rec.get("annotations") or {}]


def merged_strata(wa: dict, wb: dict) -> dict:
    """Window record `wa` with the strata that `wb` (the same window, another eval) has and `wa` lacks."""
    leakage = wb["leakage"] if wa["leakage"] is None else wa["leakage"]
    return dict(wa, leakage=leakage, annotations={**wb["annotations"], **wa["annotations"]})


def masks(rec: dict, strata: list[Stratum]) -> list[np.ndarray]:
    """Mask bool [L] of each stratum in a window record."""
    return [rec[s.section] if s.name is None else rec["annotations"][s.name] for s in strata]


def place(result: dict, strata: list[Stratum], table: Callable[[int, int], dict]) -> dict:
    """File {label: table(s, c)} of each class c of stratum s at result[section] (or [section][name])."""
    for i, stratum in enumerate(strata):
        value = {label: table(i, c) for c, label in enumerate(stratum.labels)}
        if stratum.name is None:
            result[stratum.section] = value
        else:
            result.setdefault(stratum.section, {})[stratum.name] = value
    return result


def describe(strata: list[Stratum]) -> dict:
    """summary.json's `strata`: what each section splits by."""
    meaning = {"repeat": "soft-masked (lowercase) bases of the FASTA",
               "leakage": "tokens in a K-mer that occurs in a training chromosome (prepare --leakage-k)",
               "annotations": "tokens whose genomic coordinate lies in an interval of the BED file"}
    return {s.key: {"labels": list(s.labels), "mask_true": s.labels[1], "meaning": meaning[s.section]}
            for s in strata}


def log2_edges(max_context: int) -> np.ndarray:
    """[0, 1, 2, 4, ..., 2^k] with 2^k > max_context: every context 0..max_context has a bucket."""
    return np.concatenate([[0], 2 ** np.arange(max(max_context, 0).bit_length() + 1)]).astype(np.int64)


def parse_edges(spec: str) -> np.ndarray:
    """'0,16,256,4096' -> int64 [K+1]; strictly increasing, non-negative integers (k/M allowed)."""
    from genome_lm.sizes import parse_size

    parts = [p.strip() for p in spec.split(",") if p.strip()]
    try:
        edges = np.asarray([parse_size(p, "--buckets") for p in parts], dtype=np.int64)
    except GenomeLMError:
        raise GenomeLMError(f"--buckets {spec!r}: use 'log2' or comma-separated integer edges, "
                            "e.g. 0,16,256,4k") from None
    if len(edges) < 2 or np.any(np.diff(edges) <= 0):
        raise GenomeLMError(f"--buckets {spec!r}: give at least two strictly increasing edges, e.g. 0,16,256,4k")
    return edges


def bucket_edges(spec: str, max_context: int) -> np.ndarray:
    """Edges int64 [K+1] for a `--buckets` value: 'log2' (default) or explicit edges."""
    spec = (spec or "log2").strip()
    return log2_edges(max_context) if spec == "log2" else parse_edges(spec)


def assign(contexts: np.ndarray, edges: np.ndarray, outside: int = -1) -> np.ndarray:
    """Bucket index int64 [N] of each context in `contexts` [N]; `outside` where outside [edges[0], edges[-1])."""
    idx = np.searchsorted(edges, contexts, side="right") - 1
    idx[(contexts < edges[0]) | (contexts >= edges[-1])] = outside
    return idx


def contexts_of(length: int, seq_len: int) -> np.ndarray:
    """Preceding context int64 [length] of each token of a window scored in pieces of `seq_len`."""
    return np.arange(length, dtype=np.int64) % seq_len


def window_stats(nll: np.ndarray, contexts: np.ndarray, repeat: np.ndarray, edges: np.ndarray):
    """One window -> (sums, counts, context sums) [C, K+1], from `nll` float32 [L] (NaN: not scored),
    `contexts` int64 [L], `repeat` bool [L] (each token's class: any stratum's mask) and `edges` [K+1]."""
    K = len(edges) - 1
    scored = ~np.isnan(nll)
    bucket = assign(contexts, edges, outside=K)  # outside every bucket: counted in "all" only
    cell = (repeat.astype(np.int64) * (K + 1) + bucket)[scored]
    sums, ctx, counts = (np.bincount(cell, weights=w, minlength=2 * (K + 1)).reshape(2, K + 1)
                         for w in (nll[scored].astype(np.float64), contexts[scored].astype(np.float64), None))
    # the last column so far holds tokens outside the buckets; make it "all scored tokens"
    for arr in (sums, counts, ctx):
        arr[:, K] = arr.sum(axis=1)
    return sums, counts.astype(np.int64), ctx


class StrataAccumulator:
    """`sums`, `counts` [W, S, C, K+1] and summed contexts `ctx` [S, C, K+1], filled window by window."""

    def __init__(self, n_windows: int, strata: list[Stratum], edges: np.ndarray):
        self.strata, self.edges = list(strata), edges
        shape = (n_windows, len(self.strata), 2, len(edges))
        self.sums, self.counts = np.zeros(shape), np.zeros(shape, dtype=np.int64)
        self.ctx = np.zeros(shape[1:])

    def add(self, i: int, rec: dict, contexts: np.ndarray, nll: np.ndarray | None = None) -> None:
        """Window i: `rec` holds the masks (`strata.masks`) and, unless given, `nll` float32 [L]."""
        nll = rec["nll"] if nll is None else nll
        s, n, c = zip(*(window_stats(nll, contexts, m, self.edges) for m in masks(rec, self.strata)))
        self.sums[i] += np.stack(s)
        self.counts[i] += np.stack(n)
        self.ctx += np.stack(c)

    def __add__(self, other: StrataAccumulator) -> StrataAccumulator:
        """Both accumulators (same windows and strata: the strands of an eval) pooled."""
        out = copy.copy(self)
        out.sums, out.counts, out.ctx = self.sums + other.sums, self.counts + other.counts, self.ctx + other.ctx
        return out


def bootstrap_ci(statistic: Callable[..., np.ndarray], per_window: dict[str, np.ndarray],
                 resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED, level: float = LEVEL):
    """Percentile bootstrap CI over windows: `statistic(**sums)` maps the sums over the drawn windows of
    each `per_window` array [W, M] (each sum [r, M]) to [r, S]. Returns (low [S], high [S]), NaN where the
    statistic is undefined in most replicates or fewer than two windows define it on their own: one
    window has no spread to show, and a zero-width interval would claim a precision the data lack."""
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(len(v), -1) for k, v in per_window.items()}
    W = len(next(iter(arrays.values())))  # >= 1: an eval has at least one window
    with np.errstate(divide="ignore", invalid="ignore"):
        defined_by = np.isfinite(statistic(**arrays)).sum(axis=0)  # [S]: windows whose own statistic is finite
        reps = [statistic(**{k: w @ v for k, v in arrays.items()}) for w in draws(W, resamples, seed)]
    return percentile_ci(np.concatenate(reps), defined_by >= 2, level)  # [R, S]


def draws(n: int, resamples: int, seed: int | np.random.Generator):
    """Bootstrap weights float64 [r, n], how often each of n units is drawn, in blocks of r <= _BLOCK
    replicates; each block is drawn from `seed`'s generator only when it is asked for."""
    rng = np.random.default_rng(seed)  # a Generator is used as it is
    for start in range(0, resamples, _BLOCK):
        yield rng.multinomial(n, np.full(n, 1.0 / n), size=min(_BLOCK, resamples - start)).astype(np.float64)


def percentile_ci(reps: np.ndarray, usable: np.ndarray | bool, level: float):
    """(low [S], high [S]) of replicates [R, S]; NaN where not `usable` or mostly undefined."""
    alpha = (1.0 - level) / 2
    low, high = np.full(reps.shape[1], np.nan), np.full(reps.shape[1], np.nan)
    ok = (np.isfinite(reps).mean(axis=0) >= 0.5) & usable
    if ok.any():
        low[ok], high[ok] = np.nanquantile(reps[:, ok], [alpha, 1 - alpha], axis=0)
    return low, high


def two_level_ci(statistic: Callable[..., np.ndarray], per_cell: dict[str, np.ndarray],
                 resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED, level: float = LEVEL):
    """Percentile CI of a two-level bootstrap: each resample draws R replicates (training seeds) with
    replacement, then W windows, the same for every drawn replicate; `statistic` maps the sums over the
    drawn cells of each `per_cell` array [R, W, M] to [r, S]. One replicate: the draws of `bootstrap_ci`.
    (low [S], high [S]); NaN with fewer than 2 windows or where mostly undefined."""
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(v.shape[0], v.shape[1], -1) for k, v in per_cell.items()}
    R, W = next(iter(arrays.values())).shape[:2]
    with np.errstate(divide="ignore", invalid="ignore"):
        reps, rng = [], np.random.default_rng(seed)
        for w in draws(W, resamples, rng):  # [b, W], then the replicates' draws [b, R] of the same generator
            b = len(w)
            u = rng.multinomial(R, np.full(R, 1.0 / R), size=b).astype(np.float64) if R > 1 else np.ones((b, 1))
            reps.append(statistic(**{k: np.einsum("br,rwm,bw->bm", u, v, w) for k, v in arrays.items()}))
    return percentile_ci(np.concatenate(reps), W >= 2, level)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else NaN."""
    return np.divide(num, den, out=np.full(np.broadcast(num, den).shape, np.nan), where=den > 0)


def paired_stat(a: np.ndarray, b: np.ndarray, n: np.ndarray) -> np.ndarray:
    """A's and B's NLL sums and counts [r, M] -> [r, 2M]: diff (b - a) / n, then rel % 100 (b / a - 1)."""
    return np.concatenate([ratio(b - a, n), 100 * (ratio(b, a) - 1)], axis=1)


def jfloat(x) -> float | None:
    """A JSON-safe float: None for NaN/inf."""
    x = float(x)
    return x if math.isfinite(x) else None


def bucket_table(s: np.ndarray, n: np.ndarray, c: np.ndarray, edges: np.ndarray, resamples: int, seed: int) -> dict:
    """{"overall", "buckets"} from per-window NLL sums `s` and counts `n` [W, K+1] and summed contexts `c` [K+1]."""
    total_s, total_n = s.sum(axis=0), n.sum(axis=0)
    mean = ratio(total_s, total_n)
    low, high = bootstrap_ci(lambda s, n: ratio(s, n), {"s": s, "n": n}, resamples, seed)
    ctx_mean = ratio(c, total_n)
    n_windows = (n > 0).sum(axis=0)

    def entry(k: int) -> dict:
        return {"n_tokens": int(total_n[k]), "n_windows": int(n_windows[k]), "mean_nll": jfloat(mean[k]),
                "bits_per_base": jfloat(mean[k] / LN2), "ci_low": jfloat(low[k]), "ci_high": jfloat(high[k])}

    return by_bucket(edges, entry, lambda k: {"context_mean": jfloat(ctx_mean[k])})


def by_bucket(edges: np.ndarray, entry: Callable[[int], dict], more: Callable[[int], dict] = lambda k: {}) -> dict:
    """{"overall": entry(K), "buckets": [{lo, hi, **entry(k), **more(k)}]} over the K buckets of `edges`."""
    K = len(edges) - 1
    return {"overall": entry(K), "buckets": [{"lo": int(edges[k]), "hi": int(edges[k + 1]), **entry(k), **more(k)}
                                             for k in range(K)]}


def summarize(acc: StrataAccumulator, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> dict:
    """{"overall", "buckets"} of all the tokens of `acc` and a `bucket_table` per class of each stratum (`place`)."""
    return strata_tables(acc.strata, lambda s, n, c: bucket_table(s, n, c, acc.edges, resamples, seed), acc.ctx,
                         acc.sums, acc.counts)


def strata_tables(strata: list[Stratum], table: Callable[..., dict], ctx: np.ndarray, *per_window: np.ndarray) -> dict:
    """`table(*per_window, ctx)` of all tokens, then of each class of each stratum (`place`), from
    `per_window` arrays [W, S, C, K+1] and summed contexts `ctx` [S, C, K+1]."""
    result = table(*(x[:, 0].sum(axis=1) for x in per_window), ctx[0].sum(axis=0))
    return place(result, strata, lambda i, c: table(*(x[:, i, c] for x in per_window), ctx[i, c]))


def reverse_record(rec: dict, nll_rc: np.ndarray) -> dict:
    """The reverse-complement record of a forward window record: masks reversed, `nll_rc` [L] in its order."""
    leakage = None if rec["leakage"] is None else rec["leakage"][::-1]
    return {"nll": nll_rc, "repeat": rec["repeat"][::-1], "leakage": leakage,
            "annotations": {n: m[::-1] for n, m in rec["annotations"].items()}}


class Agreement:
    """Per-window moments [W, 7, K+1] of the per-base NLL pairs (forward f, reverse r in genome order), by
    bucket of the shorter context (last column: all pairs)."""

    def __init__(self, n_windows: int, edges: np.ndarray):
        self.edges = edges
        self.moments = np.zeros((n_windows, _MOMENTS, len(edges)))

    def add(self, i: int, nll_f: np.ndarray, nll_rc: np.ndarray, contexts: np.ndarray) -> None:
        """Window i: `contexts` [L] of each strand's row (the same positions on both)."""
        f, r = nll_f.astype(np.float64), nll_rc[::-1].astype(np.float64)  # r[j]: genome position of f[j]
        shorter = np.minimum(contexts, contexts[::-1])
        both = ~(np.isnan(f) | np.isnan(r))
        K = len(self.edges) - 1
        bucket = assign(shorter, self.edges, outside=K)[both]
        f, r = f[both], r[both]
        for m, w in enumerate((None, f, r, f * f, r * r, f * r, np.abs(f - r))):
            col = np.bincount(bucket, weights=w, minlength=K + 1)
            col[K] = col.sum()
            self.moments[i, m] += col

    def result(self, resamples: int, seed: int) -> dict:
        def stat(m):  # [r, 7 (K+1)] -> pearson [K+1], mean |d| [K+1], mean d [K+1]
            n, sf, sr, sff, srr, sfr, sabs = (m[:, k::_MOMENTS] for k in range(_MOMENTS))
            cov, vf, vr = n * sfr - sf * sr, n * sff - sf * sf, n * srr - sr * sr
            return np.concatenate([ratio(cov, np.sqrt(np.maximum(vf * vr, 0))), ratio(sabs, n), ratio(sf - sr, n)],
                                  axis=1)

        per_window = self.moments.transpose(0, 2, 1).reshape(len(self.moments), -1)  # [W, (K+1) 7]
        est = stat(per_window.sum(axis=0)[None])[0]
        low, high = bootstrap_ci(stat, {"m": per_window}, resamples, seed)
        K = len(self.edges) - 1
        n = self.moments[:, 0].sum(axis=0)

        def entry(k: int) -> dict:
            a, b = K + 1 + k, 2 * (K + 1) + k
            return {"n_tokens": int(n[k]), "pearson_r": jfloat(est[k]), "pearson_ci_low": jfloat(low[k]),
                    "pearson_ci_high": jfloat(high[k]), "mean_abs_diff": jfloat(est[a]),
                    "abs_diff_ci_low": jfloat(low[a]), "abs_diff_ci_high": jfloat(high[a]),
                    "mean_diff": jfloat(est[b]), "diff_ci_low": jfloat(low[b]), "diff_ci_high": jfloat(high[b])}

        return {"definition": "the same genome position scored on the forward row (context: the bases before it) "
                              "and on the reverse-complement row (context: the bases after it); pearson_r of per-base "
                              "NLL, mean_abs_diff = mean |NLL_forward - NLL_reverse|, mean_diff = mean (forward - "
                              "reverse), nats; buckets by the shorter of the two contexts; CIs: bootstrap over windows",
                **by_bucket(self.edges, entry)}


def strand_tables(fwd: StrataAccumulator, rev: StrataAccumulator, agreement: Agreement,
                  resamples: int, seed: int) -> dict:
    return {**{k: summarize(a, resamples, seed)
               for k, a in (("forward", fwd), ("reverse", rev), ("average", fwd + rev))},
            "agreement": agreement.result(resamples, seed)}
