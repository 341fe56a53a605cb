"""`eval --strands both`: each window is also scored as its reverse complement (token j' the complement
of forward token L-1-j'; masks reversed; contexts: positions in the reverse row). summary.json `strands`
(docs/eval.md): `forward`, `reverse`, `average` (a window's strands bootstrapped together) and
`agreement` (the same base scored from each side)."""

from __future__ import annotations

import numpy as np

from genome_lm.eval.stats import StrataAccumulator, assign, bootstrap_ci, jfloat, ratio, summarize

FLIP: dict[str | None, str] = {"+": "-", "-": "+"}
_MOMENTS = 7  # n, sum f, sum r, sum f^2, sum r^2, sum f r, sum |f - r|


def reverse_record(rec: dict, nll_rc: np.ndarray) -> dict:
    """The reverse-complement row of a forward window record, `nll_rc` [L] in its own token order."""
    out = dict(rec, nll=nll_rc, strand=FLIP.get(rec.get("strand"), rec.get("strand")), rc=True)
    for key in ("repeat", "leakage"):
        if rec.get(key) is not None:
            out[key] = rec[key][::-1]
    out["annotations"] = {n: m[::-1] for n, m in (rec.get("annotations") or {}).items()}
    return out


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
                "overall": entry(K),
                "buckets": [{"lo": int(self.edges[k]), "hi": int(self.edges[k + 1]), **entry(k)} for k in range(K)]}


def strand_tables(fwd: StrataAccumulator, rev: StrataAccumulator, agreement: Agreement,
                  resamples: int, seed: int) -> dict:
    def tables(acc):
        return summarize(acc.sums, acc.counts, acc.ctx, acc.edges, resamples, seed, strata=acc.strata)

    return {"forward": tables(fwd), "reverse": tables(rev), "average": tables(fwd + rev),
            "agreement": agreement.result(resamples, seed)}
