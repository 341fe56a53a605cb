"""`genome-lm compare EVAL_A EVAL_B`: paired comparison of two evals of the same windows.

Each token scored by both evals counts once, in the bucket of its preceding context (with
different --seq-len, the context of the eval with the longer pieces). Per bucket, overall and
by repeat class:
    diff           = mean_B - mean_A          (nats/token; negative: B is better)
    rel_change_pct = 100 * (mean_B / mean_A - 1)
with 95% CIs from a paired bootstrap over windows (the same drawn windows for A and B).
`concentration` says where the gain is: each bucket's share of the total NLL reduction and
the bucket with the largest relative gain.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.eval.buckets import bucket_edges, contexts_of
from genome_lm.eval.outputs import iter_windows, load_summary, read_json, read_meta
from genome_lm.eval.stats import (
    CLASSES,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    LN2,
    bootstrap_ci,
    jfloat,
    ratio,
    window_stats,
)
from genome_lm.utils import atomic_directory, write_json_atomic

log = logging.getLogger(__name__)
COMPARE_FILE = "compare.json"
MIN_SHARE_FOR_HEADLINE = 0.01  # a bucket needs >= 1% of the tokens to be named as where the gain is


def _same_windows(a: Path, b: Path) -> dict:
    """The window columns of `a` (`read_meta`), after checking that `b` scored the same windows."""
    ma, mb = read_meta(a), read_meta(b)
    keys = ("chrom", "start", "end", "strand")
    if len(ma["window"]) != len(mb["window"]) or not all(np.array_equal(ma[k], mb[k]) for k in keys):
        raise GenomeLMError(
            f"{a} and {b} scored different windows ({len(ma['window'])} vs {len(mb['window'])}); "
            "evaluate both with the same --shards, --split and --max-windows"
        )
    return ma


def _paired_table(sa, sb, n, ctx, edges, resamples, seed) -> dict:
    """sa, sb [W, K+1] NLL sums of A and B over the same tokens, n [W, K+1] counts, ctx [K+1]
    summed contexts."""
    K = len(edges) - 1
    ta, tb, tn = sa.sum(0), sb.sum(0), n.sum(0)
    mean_a, mean_b = ratio(ta, tn), ratio(tb, tn)
    stat = lambda a, b, n: np.concatenate([ratio(b - a, n), 100 * (ratio(b, a) - 1)], axis=1)  # noqa: E731
    low, high = bootstrap_ci(stat, {"a": sa, "b": sb, "n": n}, resamples, seed)  # [2 (K+1)]: diff, then rel

    def entry(k: int) -> dict:
        return {"n_tokens": int(tn[k]), "mean_nll_a": jfloat(mean_a[k]), "mean_nll_b": jfloat(mean_b[k]),
                "diff": jfloat(mean_b[k] - mean_a[k]), "diff_ci_low": jfloat(low[k]), "diff_ci_high": jfloat(high[k]),
                "diff_bits_per_base": jfloat((mean_b[k] - mean_a[k]) / LN2),
                "rel_change_pct": jfloat(100 * (mean_b[k] / mean_a[k] - 1)) if tn[k] else None,
                "rel_ci_low": jfloat(low[K + 1 + k]), "rel_ci_high": jfloat(high[K + 1 + k])}

    gain = ta[:K] - tb[:K]  # nats saved per bucket
    total_gain = ta[K] - tb[K]
    ctx_mean = ratio(ctx, tn)
    buckets = [{"lo": int(edges[k]), "hi": int(edges[k + 1]), **entry(k), "context_mean": jfloat(ctx_mean[k]),
                "gain_share": jfloat(gain[k] / total_gain) if total_gain else None} for k in range(K)]
    return {"overall": entry(K), "buckets": buckets}


def _concentration(table: dict) -> dict:
    total = table["overall"]["n_tokens"] or 1
    big = [b for b in table["buckets"]
           if b["n_tokens"] >= MIN_SHARE_FOR_HEADLINE * total and b["rel_change_pct"] is not None]
    best = min(big, key=lambda b: b["rel_change_pct"], default=None)
    top = max(big, key=lambda b: b["gain_share"] or 0.0, default=None)
    keep = ("lo", "hi", "n_tokens", "rel_change_pct", "rel_ci_low", "rel_ci_high", "gain_share")
    return {"largest_relative_gain": {k: best[k] for k in keep} if best else None,
            "largest_share_of_gain": {k: top[k] for k in keep} if top else None}


def compare_evals(a: str | Path, b: str | Path, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> dict:
    """The paired comparison of eval directories `a` and `b` (see module docstring) as a dict."""
    a, b = Path(a), Path(b)
    for d in (a, b):
        if not d.is_dir():
            raise GenomeLMError(f"{d} does not exist; give two --out directories of `genome-lm eval`")
    sum_a, sum_b = load_summary(a), load_summary(b)
    meta = _same_windows(a, b)
    W, seq_len = len(meta["window"]), max(sum_a["config"]["seq_len"], sum_b["config"]["seq_len"])
    edges = bucket_edges(sum_a["config"]["buckets"], max_context=min(seq_len, int(meta["length"].max())) - 1)
    K = len(edges) - 1
    sa, sb = np.zeros((W, 2, K + 1)), np.zeros((W, 2, K + 1))
    n = np.zeros((W, 2, K + 1), dtype=np.int64)
    ctx = np.zeros((2, K + 1))
    for i, (wa, wb) in enumerate(zip(iter_windows(a), iter_windows(b))):
        both = ~(np.isnan(wa["nll"]) | np.isnan(wb["nll"]))
        contexts = contexts_of(len(wa["nll"]), seq_len)
        sa[i], n[i], x = window_stats(np.where(both, wa["nll"], np.nan), contexts, wa["repeat"], edges)
        sb[i], _, _ = window_stats(np.where(both, wb["nll"], np.nan), contexts, wa["repeat"], edges)
        ctx += x
    result = {
        **{k: {"dir": str(d), "checkpoint": s.get("checkpoint", {}).get("path"), "seq_len": s["config"]["seq_len"]}
           for k, d, s in (("a", a, sum_a), ("b", b, sum_b))},
        "definition": "diff = mean_nll_B - mean_nll_A (nats/token); rel_change_pct = 100 * (mean_B / mean_A - 1); "
                      "negative = B has lower loss; gain_share = the bucket's share of the total NLL reduction",
        "context": f"tokens of preceding context (position modulo seq_len {seq_len}); lo inclusive, hi exclusive",
        "n_windows": W,
        **_paired_table(sa.sum(1), sb.sum(1), n.sum(1), ctx.sum(0), edges, resamples, seed),
        "repeat": {name: _paired_table(sa[:, c], sb[:, c], n[:, c], ctx[c], edges, resamples, seed)
                   for c, name in enumerate(CLASSES)},
        "bootstrap": {"unit": "window", "paired": True, "resamples": resamples, "seed": seed, "level": 0.95},
    }
    result["concentration"] = _concentration(result)
    return result


def _num(x, spec: str, width: int = 0) -> str:
    return f"{'-' if x is None else format(x, spec):>{width}}"


def format_table(result: dict) -> str:
    """The comparison as a fixed-width text table (printed by the CLI)."""
    lines = [f"A = {result['a']['dir']}", f"B = {result['b']['dir']}",
             f"{'context':>17} {'tokens':>10} {'A nats':>8} {'B nats':>8} {'B-A':>8} {'rel %':>7} "
             f"{'95% CI (%)':>17} {'share':>6}"]

    def row(label: str, e: dict) -> str:
        ci = f"[{_num(e['rel_ci_low'], '+.2f')}, {_num(e['rel_ci_high'], '+.2f')}]"
        share = "" if e.get("gain_share") is None else f"{100 * e['gain_share']:5.1f}%"
        return (f"{label:>17} {e['n_tokens']:>10,} {_num(e['mean_nll_a'], '.4f', 8)} {_num(e['mean_nll_b'], '.4f', 8)} "
                f"{_num(e['diff'], '+.4f', 8)} {_num(e['rel_change_pct'], '+.2f', 7)} {ci:>17} {share:>6}")

    for bk in result["buckets"]:
        if bk["n_tokens"]:
            lines.append(row(f"[{bk['lo']:,}, {bk['hi']:,})", bk))
    lines.append(row("all", result["overall"]))
    for name in CLASSES:
        lines.append(row(f"all {name}", result["repeat"][name]["overall"]))
    c = result["concentration"]["largest_relative_gain"]
    if c:
        lines.append(f"largest relative change: context [{c['lo']:,}, {c['hi']:,}) {c['rel_change_pct']:+.2f}% "
                     f"(95% CI {_num(c['rel_ci_low'], '+.2f')} to {_num(c['rel_ci_high'], '+.2f')})")
    return "\n".join(lines)


def write_compare(a: str | Path, b: str | Path, out: str | Path, overwrite: bool = False, **kwargs) -> dict:
    """compare_evals(a, b) -> OUT/compare.json (atomically); returns the result."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise GenomeLMError(f"--out {out} already exists; pass --overwrite to replace it or choose another --out")
    result = compare_evals(a, b, **kwargs)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        write_json_atomic(tmp / COMPARE_FILE, result)
    log.info("compare: %s vs %s -> %s", a, b, out / COMPARE_FILE)
    return result


def load_compare(compare_dir: str | Path) -> dict:
    return read_json(compare_dir, COMPARE_FILE, "compare")
