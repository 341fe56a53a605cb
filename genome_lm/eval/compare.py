"""`genome-lm compare EVAL_A EVAL_B`: paired comparison of two evals of the same windows (docs/eval.md).
Each token scored by both counts once, in the bucket of its context (with different --seq-len, the
longer pieces'); 95% CIs from a paired bootstrap over windows.

Replicates (`compare A1,A2,A3 B1,B2,B3`): compare.json's `replicates` holds per-pair overall diffs and
ablation spans, their spread, and the pooled diff with a two-level bootstrap (`stats.two_level_ci`),
covering the seeds' spread as well as the windows'. With R replicates the seed level has only
C(2R - 1, R) distinct draws (10 for R = 3)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.eval.ablation import ablation_sums, ablation_tables
from genome_lm.eval.outputs import iter_windows, load_summary, read_json, read_meta
from genome_lm.eval.stats import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    LN2,
    StrataAccumulator,
    bootstrap_ci,
    bucket_edges,
    by_bucket,
    contexts_of,
    jfloat,
    merged_strata,
    paired_stat,
    ratio,
    strata_of,
    strata_tables,
    two_level_ci,
)
from genome_lm.outputs import atomic_directory, claim_output, holding, write_json_atomic

log = logging.getLogger(__name__)
COMPARE_FILE = "compare.json"
MIN_SHARE_FOR_HEADLINE = 0.01  # a bucket needs >= 1% of the tokens to be named as where the gain is


def _same_windows(a: Path, b: Path) -> dict:
    """`read_meta(a)`, after checking that `b` scored the same windows."""
    ma, mb = read_meta(a), read_meta(b)
    keys, n = ("chrom", "start", "end", "strand"), min(len(ma["window"]), len(mb["window"]))
    i = next((i for i in range(n) if any(ma[k][i] != mb[k][i] for k in keys)), n)  # the first that differs
    if i < max(len(ma["window"]), len(mb["window"])):
        where = lambda m: f"{m['chrom'][i]}:{m['start'][i]}-{m['end'][i]} ({m['strand'][i]})" \
            if i < len(m["window"]) else "none"  # noqa: E731
        raise GenomeLMError(
            f"{a} and {b} scored different windows ({len(ma['window'])} vs {len(mb['window'])}; window {i}: "
            f"{where(ma)} vs {where(mb)}); evaluate both with the same --shards, --split, --max-windows and "
            "--window-pick"
        )
    return ma


def _same_data(summaries: dict[Path, dict]) -> None:
    """Refuse evals of different genomes or of shards prepared otherwise (--leakage-k aside)."""
    (d0, s0), *rest = summaries.items()
    x = s0.get("shards", {})
    for d, s in rest:
        y = s.get("shards", {})
        if x.get("genome") and y.get("genome") and x["genome"] != y["genome"]:
            genome = lambda g: ", ".join(f"{f['file']} sha256 {f['sha256'][:12]}" for f in g)  # noqa: E731
            raise GenomeLMError(f"{d0} and {d} scored different genomes ({genome(x['genome'])} vs "
                                f"{genome(y['genome'])}); compare evals of the same shards")
        px, py = x.get("parameters") or {}, y.get("parameters") or {}
        keys = sorted(k for k in {*px, *py} - {"leakage_k"} if px and py and px.get(k) != py.get(k))
        if keys:
            raise GenomeLMError(f"{d0} and {d} scored shards prepared differently ("
                                + ", ".join(f"{k}: {px.get(k)} vs {py.get(k)}" for k in keys)
                                + "); compare evals of the same shards")


def _dropped(pair: tuple[dict, dict], paired: int) -> dict:
    """The tokens of each eval of `pair` that the other did not score, logged when there are any."""
    a, b = (s["overall"]["n_tokens"] - paired for s in pair)
    why = (f"scored by one eval only: the first token of each piece is not scored, and the evals' seq_len differ "
           f"({pair[0]['config']['seq_len']} vs {pair[1]['config']['seq_len']})"
           if pair[0]["config"]["seq_len"] != pair[1]["config"]["seq_len"]
           else "scored by one eval only (an N base in the other's tokens)")
    if a or b:
        log.warning("compare: %d tokens of A and %d of B are left out, %s", a, b, why)
    return {"a": a, "b": b, "why": why}


def paired_stats(a: Path, b: Path, n_windows: int, seq_len: int, edges: np.ndarray, orientation: str = "forward"):
    """(strata, acc_a, acc_b): `StrataAccumulator`s of A's and B's NLL over the tokens both scored."""
    acc_a = acc_b = strata = None
    for i, (wa, wb) in enumerate(zip(iter_windows(a, orientation), iter_windows(b, orientation))):
        rec = merged_strata(wa, wb)
        if strata is None:
            strata = strata_of(rec)
            acc_a, acc_b = (StrataAccumulator(n_windows, strata, edges) for _ in range(2))
        assert acc_a is not None and acc_b is not None  # made with strata, on the first window
        both = ~(np.isnan(wa["nll"]) | np.isnan(wb["nll"]))
        contexts = contexts_of(len(wa["nll"]), seq_len)
        acc_a.add(i, rec, contexts, np.where(both, wa["nll"], np.nan))
        acc_b.add(i, rec, contexts, np.where(both, wb["nll"], np.nan))
    return strata, acc_a, acc_b


def paired_tables(strata, acc_a, acc_b, edges, resamples, seed) -> dict:
    """{"overall", "buckets", "repeat": {...}, ("leakage", "annotations")} of `paired_stats`' result."""
    return strata_tables(strata, lambda sa, sb, n, c: _paired_table(sa, sb, n, c, edges, resamples, seed), acc_a.ctx,
                         acc_a.sums, acc_b.sums, acc_a.counts)


def _paired_table(sa, sb, n, ctx, edges, resamples, seed) -> dict:
    """From NLL sums sa, sb and counts n [W, K+1] of the same tokens, and summed contexts ctx [K+1]."""
    K = len(edges) - 1
    ta, tb, tn = sa.sum(0), sb.sum(0), n.sum(0)
    mean_a, mean_b = ratio(ta, tn), ratio(tb, tn)
    low, high = bootstrap_ci(paired_stat, {"a": sa, "b": sb, "n": n}, resamples, seed)  # [2 (K+1)]: diff, then rel

    def entry(k: int) -> dict:
        return {"n_tokens": int(tn[k]), "mean_nll_a": jfloat(mean_a[k]), "mean_nll_b": jfloat(mean_b[k]),
                "diff": jfloat(mean_b[k] - mean_a[k]), "diff_ci_low": jfloat(low[k]), "diff_ci_high": jfloat(high[k]),
                "diff_bits_per_base": jfloat((mean_b[k] - mean_a[k]) / LN2),
                "rel_change_pct": jfloat(100 * (mean_b[k] / mean_a[k] - 1)) if tn[k] else None,
                "rel_ci_low": jfloat(low[K + 1 + k]), "rel_ci_high": jfloat(high[K + 1 + k])}

    gain = ta - tb  # nats saved per bucket, then overall
    ctx_mean = ratio(ctx, tn)
    return by_bucket(edges, entry, lambda k: {"context_mean": jfloat(ctx_mean[k]),
                                              "gain_share": jfloat(gain[k] / gain[K]) if gain[K] else None})


def _concentration(table: dict) -> dict:
    total = table["overall"]["n_tokens"] or 1
    big = [b for b in table["buckets"]
           if b["n_tokens"] >= MIN_SHARE_FOR_HEADLINE * total and b["rel_change_pct"] is not None]
    best = min(big, key=lambda b: b["rel_change_pct"], default=None)
    top = max(big, key=lambda b: b["gain_share"] or 0.0, default=None)
    keep = ("lo", "hi", "n_tokens", "rel_change_pct", "rel_ci_low", "rel_ci_high", "gain_share")
    return {"largest_relative_gain": {k: best[k] for k in keep} if best else None,
            "largest_share_of_gain": {k: top[k] for k in keep} if top else None}


def _compare_strands(pairs, summaries, fwd, fwd_tables, W, seq_len, edges, resamples, seed) -> dict:
    """compare.json's `strands`; `{"absent": why}` unless every eval of `pairs` has both strands."""
    lacking = [d for pair, sums in zip(pairs, summaries) for d, s in zip(pair, sums) if "strands" not in s]
    if lacking:
        return {"absent": f"{lacking[0]} scored one strand only (eval --strands both)"}
    rev = _pooled([paired_stats(a, b, W, seq_len, edges, "reverse") for a, b in pairs])
    avg = (fwd[0], fwd[1] + rev[1], fwd[2] + rev[2])
    out = {"forward": fwd_tables, "reverse": paired_tables(*rev, edges, resamples, seed),
           "average": paired_tables(*avg, edges, resamples, seed),
           "definition": "forward: the rows as stored (the top level); reverse: their reverse complements; "
                         "average: both pooled, each base once per strand, windows drawn with both strands; "
                         "agreement: each eval's per-base agreement between the strands (summary.json "
                         "strands.agreement.overall)"}
    if len(pairs) == 1:
        out["agreement"] = {k: s["strands"]["agreement"]["overall"] for k, s in zip("ab", summaries[0])}
    return out


def _pooled(stats: list[tuple]) -> tuple[Any, Any, Any]:
    """`paired_stats` of replicate pairs -> one, whose window sums are the mean over the pairs (each
    token's NLL averaged over a side's replicates); the pairs must have scored the same tokens."""
    strata, acc_a, acc_b = stats[0]
    for other in stats[1:]:
        if [s.key for s in other[0]] != [s.key for s in strata]:
            raise GenomeLMError("the replicates' evals split by different strata (leakage mask, --annotate); "
                                "evaluate every replicate with the same shards and --annotate files")
        if not np.array_equal(other[1].counts, acc_a.counts):
            raise GenomeLMError("the replicates' evals scored different tokens; evaluate every replicate with the "
                                "same shards, --split, --max-windows, --window-pick and --seq-len")
    pooled = copy.copy(acc_a), copy.copy(acc_b)  # counts and contexts: the same in every pair, on both sides
    for j, acc in enumerate(pooled, 1):
        acc.sums = np.mean([st[j].sums for st in stats], axis=0)
    return strata, *pooled


def eval_dirs(spec: str | Path | list | tuple, which: str) -> list[Path]:
    """The eval directories of side `which` (A or B): a directory, a list, or a comma-separated string."""
    items = [x.strip() for x in str(spec).split(",")] if isinstance(spec, (str, Path)) else list(spec)
    dirs = [Path(x) for x in items if str(x)]
    if not dirs:
        raise GenomeLMError(f"eval {which}: no directory given")
    if len(dirs) < len(items):
        raise GenomeLMError(f"eval {which} {spec!s}: an empty name between its commas; give the eval directories "
                            "separated by single commas, e.g. evals/long_s1,evals/long_s2")
    for d in dirs:
        if not d.is_dir():
            raise GenomeLMError(f"{d} {'is a file, not a directory' if d.exists() else 'does not exist'}; give --out "
                                "directories of `genome-lm eval` (replicates of one model: comma-separated, e.g. "
                                "evals/long_s1,evals/long_s2)")
    return dirs


def compare_evals(a: str | Path | list, b: str | Path | list, resamples: int = DEFAULT_RESAMPLES,
                  seed: int = DEFAULT_SEED) -> dict:
    """The paired comparison of eval directories `a` and `b` (or of their replicates) as a dict."""
    A, B = eval_dirs(a, "A"), eval_dirs(b, "B")
    n = max(len(A), len(B))
    A, B = (A * n if len(A) == 1 else A), (B * n if len(B) == 1 else B)  # one model against the other's replicates
    if len(A) != len(B):
        raise GenomeLMError(f"{len(A)} replicate evals for A and {len(B)} for B: give as many of each, in the same "
                            "seed order (replicate i of A is compared with replicate i of B), or one eval on a side "
                            "(compared with every replicate of the other)")
    pairs = list(zip(A, B))
    distinct = list(dict.fromkeys(A + B))  # a side given once is paired with each replicate: read it once
    summary = {d: load_summary(d) for d in distinct}
    summaries = [(summary[x], summary[y]) for x, y in pairs]
    _same_data(summary)
    meta = _same_windows(A[0], B[0])
    for d in distinct:
        if d not in (A[0], B[0]):
            _same_windows(A[0], d)
    W = len(meta["window"])
    seq_len = max(s["config"]["seq_len"] for pair in summaries for s in pair)
    edges = bucket_edges(summaries[0][0]["config"]["buckets"], max_context=min(seq_len, int(meta["length"].max())) - 1)
    per_pair = [paired_stats(x, y, W, seq_len, edges) for x, y in pairs]
    fwd = _pooled(per_pair)
    tables = paired_tables(*fwd, edges, resamples, seed)

    def side(dirs, sums):
        paths = [s.get("checkpoint", {}).get("path") for s in sums]
        one = {"checkpoint": paths[0]} if len(dirs) == 1 else {"dirs": [str(d) for d in dirs], "checkpoints": paths}
        return {"dir": ",".join(map(str, dirs)), **one, "seq_len": sums[0]["config"]["seq_len"]}

    result = {
        "a": side(A, [s[0] for s in summaries]), "b": side(B, [s[1] for s in summaries]),
        "definition": "diff = mean_nll_B - mean_nll_A (nats/token); rel_change_pct = 100 * (mean_B / mean_A - 1); "
                      "negative = B has lower loss; gain_share = the bucket's share of the total NLL reduction"
                      + ("; with replicates, mean_nll is over every replicate's NLL of each token" if len(pairs) > 1
                         else ""),
        "context": f"tokens of preceding context (position modulo seq_len {seq_len}); lo inclusive, hi exclusive",
        "n_windows": W,
        **tables,
        "bootstrap": {"unit": "window", "paired": True, "resamples": resamples, "seed": seed, "level": 0.95},
    }
    if any("strands" in s for pair in summaries for s in pair):
        result["strands"] = _compare_strands(pairs, summaries, fwd, tables, W, seq_len, edges, resamples, seed)
    ablation = None
    if any(s.get("context_ablation") for pair in summaries for s in pair):
        per_abl = [ablation_sums(x, y, (sx.get("context_ablation") or {}).get("lengths", []),
                                 (sy.get("context_ablation") or {}).get("lengths", []))
                   for (x, y), (sx, sy) in zip(pairs, summaries)]
        absent = next((p for p in per_abl if isinstance(p, str)), None)
        ablation = None if absent else per_abl
        result["context_ablation"] = {"absent": absent} if absent else ablation_tables(_pooled_ablation(per_abl),
                                                                                        resamples, seed)
    if "leakage" not in tables:
        result["strata_absent"] = {"leakage": "neither eval has a leakage_mask (shards prepared without --leakage-k)"}
    result["concentration"] = _concentration(result)
    result["dropped_tokens"] = _dropped(summaries[0], tables["overall"]["n_tokens"])
    if len(pairs) > 1:
        result["replicates"] = replicates_section(per_pair, ablation, [(str(x), str(y)) for x, y in pairs],
                                                  resamples, seed)
    return result


def _pooled_ablation(per_pair: list):
    """`ablation_sums` of replicate pairs -> one, as `_pooled` does."""
    common, strata, sa, sb, n = per_pair[0]
    for c, s, xa, _, xn in per_pair[1:]:
        if c != common or xa.shape != sa.shape or [t.key for t in s] != [t.key for t in strata] \
                or not np.array_equal(xn, n):
            raise GenomeLMError("the replicates' context ablations differ (lengths, targets or strata); evaluate "
                                "every replicate with the same --context, --ablation-targets, windows and --annotate")
    means = [np.mean([p[j] for p in per_pair], axis=0) for j in (2, 3)]  # over the replicate pairs
    return common, strata, *means, n


def check_sides(A: list[Path], B: list[Path]) -> None:
    """Refuse an eval given twice on one side; warn when both sides are the same eval(s)."""
    for which, dirs in (("A", A), ("B", B)):
        seen: dict[Path, Path] = {}
        for d in dirs:
            if d.resolve() in seen:
                raise GenomeLMError(f"eval {which} lists {seen[d.resolve()]} twice ({d}); replicates are evals of "
                                    "models trained with different seeds: give each once")
            seen[d.resolve()] = d
    if [d.resolve() for d in A] == [d.resolve() for d in B]:
        log.warning("compare: A and B are the same eval%s (%s); every difference is 0", "s" if len(A) > 1 else "",
                    ",".join(map(str, A)))


def write_compare(a: str | Path, b: str | Path, out: str | Path, overwrite: bool = False, **kwargs) -> dict:
    """compare_evals(a, b) -> OUT/compare.json; returns the result."""
    out = Path(out)
    A, B = eval_dirs(a, "A"), eval_dirs(b, "B")  # a comma-separated side: each replicate is an input
    check_sides(A, B)
    with holding(out, "compare"):
        claim_output(out, "compare", [*A, *B], overwrite)
        result = compare_evals(a, b, **kwargs)
        with atomic_directory(out, "compare", [*A, *B], overwrite=overwrite) as tmp:
            write_json_atomic(tmp / COMPARE_FILE, result)
    log.info("compare: %s vs %s -> %s", a, b, out / COMPARE_FILE)
    return result


def load_compare(compare_dir: str | Path) -> dict:
    return read_json(compare_dir, COMPARE_FILE, "compare")


def _diff_entry(sa: np.ndarray, sb: np.ndarray, n: np.ndarray, resamples: int, seed: int) -> dict:
    """diff and rel_change_pct of B - A with two-level CIs, from sums and counts [R, W]."""
    low, high = two_level_ci(paired_stat, {"a": sa[..., None], "b": sb[..., None], "n": n[..., None]}, resamples, seed)
    d = float(sb.sum() / n.sum() - sa.sum() / n.sum())  # as the two-eval compare: mean_B - mean_A
    return {"diff": jfloat(d), "diff_ci_low": jfloat(low[0]), "diff_ci_high": jfloat(high[0]),
            "diff_bits_per_base": jfloat(d / LN2), "rel_change_pct": jfloat(100 * (sb.sum() / sa.sum() - 1)),
            "rel_ci_low": jfloat(low[1]), "rel_ci_high": jfloat(high[1])}


def _spread(values: list[float | None]) -> dict:
    v = np.array([np.nan if x is None else x for x in values], dtype=np.float64)
    return {"mean": jfloat(np.nanmean(v)), "sd": jfloat(np.nanstd(v, ddof=1)) if np.isfinite(v).sum() > 1 else None,
            "min": jfloat(np.nanmin(v)), "max": jfloat(np.nanmax(v)), "negative": int((v < 0).sum())}


def _span_entry(s: np.ndarray, n: np.ndarray, resamples: int, seed: int) -> dict:
    """One side's ablation span (longest L minus shortest L, nats per target) with two-level CIs, from
    sums [R, W, n_L] and counts [R, W]."""
    low, high = two_level_ci(lambda s, n: ratio(s[:, -1:] - s[:, :1], n), {"s": s, "n": n[..., None]}, resamples, seed)
    d = float((s[..., -1].sum() - s[..., 0].sum()) / n.sum())
    return {"mean_delta": jfloat(d), "mean_delta_bits": jfloat(d / LN2), "ci_low": jfloat(low[0]),
            "ci_high": jfloat(high[0])}


def _ablation_section(ablation: list, pairs: list[dict], resamples: int, seed: int) -> dict:
    common = ablation[0][0]
    sa, sb = (np.stack([p[j][:, 0] for p in ablation]) for j in (2, 3))  # [R, W, n_L]: all targets
    n = np.stack([p[4][:, 0] for p in ablation]).astype(np.float64)  # [R, W]
    for i, entry in enumerate(pairs):  # each pair's own span, CIs over its windows
        entry["ablation_span"] = {"a": _span_entry(sa[i:i + 1], n[i:i + 1], resamples, seed),
                                  "b": _span_entry(sb[i:i + 1], n[i:i + 1], resamples, seed)}
    low, high = two_level_ci(lambda a, b, n: ratio((b[:, -1:] - b[:, :1]) - (a[:, -1:] - a[:, :1]), n),
                             {"a": sa, "b": sb, "n": n[..., None]}, resamples, seed)  # the spans' difference
    g = float(((sb[..., -1] - sb[..., 0]).sum() - (sa[..., -1] - sa[..., 0]).sum()) / n.sum())
    return {"from": int(common[0]), "to": int(common[-1]), "target_tokens": int(n[0].sum()),
            "a": _span_entry(sa, n, resamples, seed), "b": _span_entry(sb, n, resamples, seed),
            "gain_difference": {"diff": jfloat(g), "diff_bits": jfloat(g / LN2), "ci_low": jfloat(low[0]),
                                "ci_high": jfloat(high[0])},
            "spread": {k: _spread([p["ablation_span"][k]["mean_delta"] for p in pairs]) for k in "ab"}}


def replicates_section(per_pair: list[tuple], ablation: list | None, dirs: list[tuple[str, str]], resamples: int,
                       seed: int) -> dict:
    """From each pair's `paired_stats`, its `ablation.ablation_sums` (None: no ablation) and directories."""
    sa, sb = (np.stack([st[j].sums[:, 0, :, -1].sum(axis=1) for st in per_pair]) for j in (1, 2))  # [R, W]: all tokens
    n = np.stack([st[1].counts[:, 0, :, -1].sum(axis=1) for st in per_pair]).astype(np.float64)
    # one pair: its window bootstrap, as its own two-eval compare's overall CI
    pairs = [{"a": a, "b": b, "n_tokens": int(n[i].sum()), "mean_nll_a": jfloat(sa[i].sum() / n[i].sum()),
              "mean_nll_b": jfloat(sb[i].sum() / n[i].sum()),
              **_diff_entry(sa[i:i + 1], sb[i:i + 1], n[i:i + 1], resamples, seed)} for i, (a, b) in enumerate(dirs)]
    out = {"n": len(dirs), "pairs": pairs,
           "spread": {"diff": _spread([p["diff"] for p in pairs]),
                      "rel_change_pct": _spread([p["rel_change_pct"] for p in pairs])},
           "overall": _diff_entry(sa, sb, n, resamples, seed)}
    if ablation:
        out["context_ablation"] = _ablation_section(ablation, pairs, resamples, seed)
    out["definition"] = ("replicate i of A paired with replicate i of B; pairs: each pair's own compare (CIs over "
                         "windows); spread: over the pairs (sd with ddof 1); overall and context_ablation: the "
                         "pooled estimate with CIs of a bootstrap over pairs, then windows; ablation spans: mean NLL "
                         "at the longest L minus at the shortest, over the same targets (negative: more context helps)")
    out["bootstrap"] = {"unit": "replicate pair, then window", "resamples": resamples, "seed": seed, "level": 0.95}
    return out


def compare_command(p) -> str:
    """`genome-lm compare`: `p` its CompareParams."""
    from genome_lm.eval.text import format_table

    return format_table(write_compare(p.eval_a, p.eval_b, p.out, overwrite=p.overwrite))
