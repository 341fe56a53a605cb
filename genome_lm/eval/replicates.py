"""compare.json's `replicates` (`compare A1,A2,A3 B1,B2,B3`, docs/eval.md): per-pair overall diffs and
ablation spans, their spread, and the pooled diff with a two-level bootstrap (`stats.two_level_ci`),
covering the seeds' spread as well as the windows'. With R replicates the seed level has only
C(2R - 1, R) distinct draws (10 for R = 3)."""

from __future__ import annotations

import numpy as np

from genome_lm.eval.stats import LN2, jfloat, paired_stat, ratio, two_level_ci


def _overall(stats: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sum_a, sum_b, count) float64 [W] over all scored tokens of one pair's `paired_stats`."""
    _, acc_a, acc_b = stats
    return acc_a.sums[:, 0, :, -1].sum(axis=1), acc_b.sums[:, 0, :, -1].sum(axis=1), \
        acc_a.counts[:, 0, :, -1].sum(axis=1).astype(np.float64)


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
    def stat(s, n):
        return ratio(s[:, -1:] - s[:, :1], n)

    low, high = two_level_ci(stat, {"s": s, "n": n[..., None]}, resamples, seed)
    d = float((s[..., -1].sum() - s[..., 0].sum()) / n.sum())
    return {"mean_delta": jfloat(d), "mean_delta_bits": jfloat(d / LN2), "ci_low": jfloat(low[0]),
            "ci_high": jfloat(high[0])}


def _ablation_section(ablation: list, span_pairs: list[dict], resamples: int, seed: int) -> dict:
    common = ablation[0][0]
    sa = np.stack([p[2][:, 0] for p in ablation])  # [R, W, n_L]: all targets
    sb = np.stack([p[3][:, 0] for p in ablation])
    n = np.stack([p[4][:, 0] for p in ablation]).astype(np.float64)  # [R, W]

    def gain(a, b, n):
        return ratio((b[:, -1:] - b[:, :1]) - (a[:, -1:] - a[:, :1]), n)

    low, high = two_level_ci(gain, {"a": sa, "b": sb, "n": n[..., None]}, resamples, seed)
    g = float(((sb[..., -1] - sb[..., 0]).sum() - (sa[..., -1] - sa[..., 0]).sum()) / n.sum())
    return {"from": int(common[0]), "to": int(common[-1]), "target_tokens": int(n[0].sum()),
            "a": _span_entry(sa, n, resamples, seed), "b": _span_entry(sb, n, resamples, seed),
            "gain_difference": {"diff": jfloat(g), "diff_bits": jfloat(g / LN2), "ci_low": jfloat(low[0]),
                                "ci_high": jfloat(high[0])},
            "spread": {"a": _spread([p["a"]["mean_delta"] for p in span_pairs]),
                       "b": _spread([p["b"]["mean_delta"] for p in span_pairs])}}


def replicates_section(per_pair: list[tuple], ablation: list | None, dirs: list[tuple[str, str]], resamples: int,
                       seed: int) -> dict:
    """From each pair's `paired_stats`, its `ablation.ablation_sums` (None: no ablation) and directories."""
    sums = [_overall(st) for st in per_pair]
    sa, sb, n = (np.stack([s[j] for s in sums]) for j in range(3))  # [R, W]
    pairs = []
    for i, (a, b) in enumerate(dirs):  # one pair: its window bootstrap, as its own two-eval compare's overall CI
        pairs.append({"a": a, "b": b, "n_tokens": int(n[i].sum()), "mean_nll_a": jfloat(sa[i].sum() / n[i].sum()),
                      "mean_nll_b": jfloat(sb[i].sum() / n[i].sum()),
                      **_diff_entry(sa[i:i + 1], sb[i:i + 1], n[i:i + 1], resamples, seed)})
    out = {"n": len(dirs), "pairs": pairs,
           "spread": {"diff": _spread([p["diff"] for p in pairs]),
                      "rel_change_pct": _spread([p["rel_change_pct"] for p in pairs])},
           "overall": _diff_entry(sa, sb, n, resamples, seed)}
    if ablation:
        spans = [{k: _span_entry(x[None, :, 0], xn[None, :, 0].astype(np.float64), resamples, seed)
                  for k, x in (("a", xa), ("b", xb))} for _, _, xa, xb, xn in ablation]
        for entry, span in zip(pairs, spans):
            entry["ablation_span"] = span
        out["context_ablation"] = _ablation_section(ablation, spans, resamples, seed)
    out["definition"] = ("replicate i of A paired with replicate i of B; pairs: each pair's own compare (CIs over "
                         "windows); spread: over the pairs (sd with ddof 1); overall and context_ablation: the "
                         "pooled estimate with CIs of a bootstrap over pairs, then windows; ablation spans: mean NLL "
                         "at the longest L minus at the shortest, over the same targets (negative: more context helps)")
    out["bootstrap"] = {"unit": "replicate pair, then window", "resamples": resamples, "seed": seed, "level": 0.95}
    return out
