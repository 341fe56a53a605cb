"""The report section "variant effect by context", from a `genome-lm variants` output folder (its
summary.json's "metrics", docs/score.md); unlabelled runs ("metrics": null) get the counts only."""

from __future__ import annotations

import html
import json
from pathlib import Path

from matplotlib.figure import Figure

from genome_lm.errors import GenomeLMError
from genome_lm.report.data import EvalResult
from genome_lm.report.plots import COLORS, _context_axis
from genome_lm.report.tables import _num, _table

SUMMARY = "summary.json"


def split_variants(dirs: list[Path]) -> tuple[list[EvalResult], list[Path]]:
    """The variants outputs among `dirs` as (label, dir, summary), and the other dirs."""
    found, rest = [], []
    for d in dirs:
        try:
            summary = json.loads((d / SUMMARY).read_text())
        except (OSError, ValueError):
            summary = None
        command = summary.get("command") if isinstance(summary, dict) else None
        if command == "score":
            raise GenomeLMError(f"{d} is a `genome-lm score` output (per-base log-probs); the report reads the "
                                "--out of `genome-lm eval`, `compare` and `variants`")
        if command != "variants":
            rest.append(d)
        elif missing := [k for k in ("contexts", "variants", "metrics") if k not in summary]:
            raise GenomeLMError(f"{d / SUMMARY} is not a variants summary (it has no {', '.join(missing)}); rebuild "
                                "it with `genome-lm variants` and --overwrite")
        else:
            found.append(EvalResult(d.name, d, summary))
    return found, rest


def plot_roc(v: EvalResult) -> Figure:
    fig = Figure(figsize=(5.2, 4.6))
    ax = fig.add_subplot()
    auroc = {r["context"]: r["auroc"] for r in v.summary["metrics"]["by_context"]}
    for i, r in enumerate(v.summary["metrics"]["roc"]):
        ax.plot(r["fpr"], r["tpr"], color=COLORS[i % len(COLORS)],
                label=f"L = {r['context']:,} (AUROC {_num(auroc.get(r['context']), '{:.3f}')})")
    ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls="--")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title=v.label)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def plot_score_shift(v: EvalResult) -> Figure:
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    rows = v.summary["metrics"]["score_shift"]
    x = [r["context"] for r in rows]
    for key, label, color in (("mean_score_pos", "positive (label 1)", COLORS[1]),
                              ("mean_score_neg", "benign (label 0)", COLORS[0]), ("mean_score", "all", "0.33")):
        ax.plot(x, [r[key] for r in rows], marker="o", color=color, label=label)
    _context_axis(ax)
    ax.axhline(0, color="0.6", lw=0.8)
    ax.set(xlabel="context before the variant (bases)", ylabel="mean score (nats; log P(alt) - log P(ref))",
           title=v.label)
    ax.legend(fontsize=8)
    return fig


def metrics_table(v: EvalResult) -> str:
    m = v.summary["metrics"]
    paired = {r["context"]: r for r in m["paired_vs_shortest"]}
    ci = lambda pair: f"[{_num(pair[0], '{:+.3f}')}, {_num(pair[1], '{:+.3f}')}]" if pair else "\u2013"  # noqa: E731
    rows = []
    for r in m["by_context"]:
        p = paired.get(r["context"], {})
        rows.append([f"{r['context']:,}", f"{r['n_pos']:,}", f"{r['n_neg']:,}", _num(r["auroc"], "{:.3f}"),
                     ci(r.get("auroc_ci")), _num(r["auprc"], "{:.3f}"), ci(r.get("auprc_ci")),
                     _num(p.get("d_auroc"), "{:+.3f}"), ci(p.get("d_auroc_ci")), _num(p.get("d_auprc"), "{:+.3f}"),
                     ci(p.get("d_auprc_ci"))])
    return _table(["context", "positives", "negatives", "AUROC", "95% CI", "AUPRC", "95% CI", "AUROC - shortest",
                   "95% CI", "AUPRC - shortest", "95% CI"], rows,
                  f"{v.label}: variant effect by context (strand {m.get('strand', '?')})")


def variants_section(v: EvalResult, figure) -> list[str]:
    """The section's HTML parts; `figure(fig, alt, caption)` embeds a plot."""
    s, counts = v.summary, v.summary["variants"]
    skipped = ", ".join(f"{n:,} {why.replace('_', ' ')}" for why, n in counts.get("skipped", {}).items() if n)
    text = (f"{v.label}: {counts.get('scored', 0):,} of {counts.get('read', 0):,} variants scored"
            f"{' (skipped: ' + skipped + ')' if skipped else ''} at contexts "
            f"{', '.join(f'{c:,}' for c in s['contexts'])}, scored over the variant and {s.get('after', 0):,} bases "
            f"after it; score = log P(alt) - log P(ref) given exactly L bases before it.")
    out = ["<h2>Variant effect by context</h2>", f"<p>{html.escape(text)}</p>"]
    if not s["metrics"]:
        return out + ["<p>No labels were given (variants --labels / --labels-tsv): no AUROC.</p>"]
    return out + [figure(plot_roc(v), "ROC by context", "ROC curve of -score per context L (label 1 = positive)."),
                  figure(plot_score_shift(v), "score shift vs context",
                         "Mean variant score by context length, for positive and benign variants and all."),
                  metrics_table(v)]
