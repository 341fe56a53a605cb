"""How well variant scores separate labels, by context: AUROC, AUPRC, ROC points, with bootstrap CIs.

The predictor is -score (a lower log-likelihood of the alt sequence predicts the positive class). Both
metrics are computed from weighted counts of positives and negatives per distinct predictor value, so
one bootstrap replicate is a weight vector (how often each variant is drawn) and all replicates of all
contexts are matrix work; the paired difference against the shortest context uses the same draws.
Ties count half (AUROC: the Mann-Whitney statistic; AUPRC: average precision with tied values as one
threshold, as scikit-learn computes it).
"""

from __future__ import annotations

import numpy as np

from genome_lm.eval.stats import _BLOCK, DEFAULT_RESAMPLES, DEFAULT_SEED, LEVEL, _percentile_ci, jfloat

ROC_POINTS = 200


def _groups(predictor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order sorting `predictor` descending, start of each run of equal values in that order)."""
    order = np.argsort(-predictor, kind="stable")
    p = predictor[order]
    return order, np.flatnonzero(np.r_[True, p[1:] != p[:-1]])


def _curves(predictor: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Weighted positives and negatives per distinct value, highest first: (P [r, G], N [r, G]) for
    weights `w` [r, n]."""
    order, starts = _groups(predictor)
    wp, wn = w[:, order] * y[order], w[:, order] * (1 - y[order])
    return np.add.reduceat(wp, starts, axis=1), np.add.reduceat(wn, starts, axis=1)


def auroc_auprc(predictor: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """AUROC [r] and AUPRC [r] of `predictor` [n] for labels `y` [n] (1/0) under weights `w` [r, n]
    (default: each variant once); NaN without a positive or a negative."""
    w = np.ones((1, len(y))) if w is None else w
    P, N = _curves(predictor, y.astype(np.float64), w)
    tp, fp = np.cumsum(P, axis=1), np.cumsum(N, axis=1)
    n_pos, n_neg = tp[:, -1], fp[:, -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        above = fp - N  # negatives ranked strictly above each group
        auroc = (P * (n_neg[:, None] - above - 0.5 * N)).sum(axis=1) / (n_pos * n_neg)
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        auprc = (P * precision).sum(axis=1) / n_pos
    bad = (n_pos == 0) | (n_neg == 0)
    return np.where(bad, np.nan, auroc), np.where(bad, np.nan, auprc)


def roc_points(predictor: np.ndarray, y: np.ndarray, points: int = ROC_POINTS) -> dict:
    """{"fpr": [...], "tpr": [...]} from (0, 0) to (1, 1), at most about `points` points."""
    P, N = _curves(predictor, y.astype(np.float64), np.ones((1, len(y))))
    tpr = np.r_[0.0, np.cumsum(P[0]) / max(P.sum(), 1)]
    fpr = np.r_[0.0, np.cumsum(N[0]) / max(N.sum(), 1)]
    keep = np.unique(np.linspace(0, len(tpr) - 1, min(points, len(tpr))).round().astype(int))
    return {"fpr": [round(float(x), 5) for x in fpr[keep]], "tpr": [round(float(x), 5) for x in tpr[keep]]}


def metrics(scores: dict[int, np.ndarray], y: np.ndarray, strand: str, resamples: int = DEFAULT_RESAMPLES,
            seed: int = DEFAULT_SEED) -> dict:
    """summary.json's "metrics" for `scores` {context: score [n]} of n labelled variants `y` [n] (the same
    variants at every context, in one order): AUROC, AUPRC with CIs per context, their paired difference
    against the shortest context, ROC points and the score shift."""
    contexts = sorted(scores)
    preds = [-np.asarray(scores[c], dtype=np.float64) for c in contexts]
    point = np.array([auroc_auprc(p, y) for p in preds])[:, :, 0]  # [C, 2]
    reps, rng, n = [], np.random.default_rng(seed), len(y)
    for start in range(0, resamples, _BLOCK):  # weights [r, n]: how often each variant is drawn
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=min(_BLOCK, resamples - start)).astype(np.float64)
        reps.append(np.stack([np.stack(auroc_auprc(p, y, w), axis=1) for p in preds], axis=1))  # [r, C, 2]
    rep = np.concatenate(reps)
    usable = min(int(y.sum()), int(n - y.sum())) >= 2
    lo, hi = _percentile_ci(rep.reshape(len(rep), -1), usable, LEVEL)
    dlo, dhi = _percentile_ci((rep - rep[:, :1]).reshape(len(rep), -1), usable, LEVEL)
    lo, hi, dlo, dhi = (a.reshape(len(contexts), 2) for a in (lo, hi, dlo, dhi))
    by, paired, roc, shift = [], [], [], []
    for k, c in enumerate(contexts):
        s = np.asarray(scores[c], dtype=np.float64)
        by.append({"context": c, "n_pos": int(y.sum()), "n_neg": int(n - y.sum()), "auroc": jfloat(point[k, 0]),
                   "auroc_ci": [jfloat(lo[k, 0]), jfloat(hi[k, 0])], "auprc": jfloat(point[k, 1]),
                   "auprc_ci": [jfloat(lo[k, 1]), jfloat(hi[k, 1])]})
        d = point[k] - point[0]
        paired.append({"context": c, "d_auroc": jfloat(d[0]), "d_auroc_ci": [jfloat(dlo[k, 0]), jfloat(dhi[k, 0])],
                       "d_auprc": jfloat(d[1]), "d_auprc_ci": [jfloat(dlo[k, 1]), jfloat(dhi[k, 1])]})
        roc.append({"context": c, **roc_points(preds[k], y)})
        shift.append({"context": c, "mean_score": jfloat(s.mean()),
                      **{f"mean_score_{k}": jfloat(s[y == v].mean()) if (y == v).any() else None
                         for k, v in (("pos", 1), ("neg", 0))}})
    return {"strand": strand, "by_context": by, "paired_vs_shortest": paired, "roc": roc, "score_shift": shift}
