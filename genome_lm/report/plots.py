"""Report figures (matplotlib `Figure`s, no pyplot state; `figure_png` renders one with Agg). A context
bucket is plotted at the mean context of its tokens; empty buckets are left out. Losses in bits per base."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from genome_lm.eval.stats import LN2
from genome_lm.report.data import CompareResult, EvalResult, RunMetrics
from genome_lm.report.matched import PAIRS, ContextGain
from genome_lm.report.tables import _num

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
DPI = 110


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _series(buckets: list[dict], mean: str, low: str, high: str, scale: float = 1.0):
    """x, y, y_low, y_high float64 [K'] over non-empty buckets with a context of at least 1."""
    rows = [b for b in buckets if b["n_tokens"] and b.get(mean) is not None and b["context_mean"] >= 1]
    get = lambda key: np.array([np.nan if b.get(key) is None else b[key] * scale for b in rows])  # noqa: E731
    return np.array([b["context_mean"] for b in rows], dtype=float), get(mean), get(low), get(high)


def _context_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tokens(v)))
    ax.set_xlabel("preceding context (tokens, log scale)")
    ax.grid(True, which="major", alpha=0.3)


def _tokens(v: float) -> str:
    if v >= 2**20:
        return f"{v / 2**20:g}M"
    if v >= 2**10:
        return f"{v / 2**10:g}k"
    return f"{v:g}"


def _nats_axis(ax) -> None:
    ax.secondary_yaxis("right", functions=(lambda b: b * LN2, lambda n: n / LN2)).set_ylabel("nats per token")


def _lines(lines: list, ylabel: str, legend: str, title: str, zero: bool = False):
    """(fig, ax): one line per (color, (x, y, lo, hi), label) over preceding context, its CI as a band."""
    fig = Figure(figsize=(8.5, 5))
    ax = fig.add_subplot()
    if zero:
        ax.axhline(0, color="0.3", lw=1)
    for color, (x, y, lo, hi), label in lines:
        ax.plot(x, y, "-o", color=color, ms=4, lw=1.8, label=label)
        ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)
    _context_axis(ax)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=9, title=legend, title_fontsize=8)
    return fig, ax


def plot_loss_by_context(evals: list[EvalResult], title: str = "Held-out loss by preceding context") -> Figure:
    """One line per eval: mean loss per context bucket with its 95% bootstrap CI as a band."""
    lines = [(COLORS[i % len(COLORS)], _series(ev.summary["buckets"], "mean_nll", "ci_low", "ci_high", 1 / LN2),
              f"{ev.label} (all tokens: {ev.summary['overall']['bits_per_base']:.3f} bits/base)")
             for i, ev in enumerate(evals)]
    fig, ax = _lines(lines, "loss (bits per base)", "eval (shaded: 95% CI, bootstrap over windows)", title)
    _nats_axis(ax)
    return fig


def plot_relative_change(compares: list[CompareResult],
                         title: str = "Relative change in loss by preceding context") -> Figure:
    """One line per comparison: 100 * (mean_B / mean_A - 1) per bucket with its paired 95% CI."""
    lines = [(COLORS[(i + 1) % len(COLORS)],
              _series(c.result["buckets"], "rel_change_pct", "rel_ci_low", "rel_ci_high"),
              f"{c.label} (all tokens: {c.result['overall']['rel_change_pct']:+.2f}%)") for i, c in enumerate(compares)]
    return _lines(lines, "change in loss, B vs A (%)\nbelow 0: B has lower loss", "B vs A (shaded: paired 95% CI)",
                  title, zero=True)[0]


def plot_repeat_split(evals: list[EvalResult], title: str = "Repeat-masked vs unmasked bases") -> Figure:
    """Two panels (unmasked, repeat-masked) sharing the y-axis: loss by context, one line per eval."""
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (name, what) in zip(axes, (("unmasked", "unmasked bases"),
                                       ("masked", "repeat-masked (soft-masked) bases"))):
        for i, ev in enumerate(evals):
            color = COLORS[i % len(COLORS)]
            part = ev.summary["repeat"][name]
            x, y, lo, hi = _series(part["buckets"], "mean_nll", "ci_low", "ci_high", 1 / LN2)
            if not len(x):
                continue
            o = part["overall"]
            ax.plot(x, y, "-o", color=color, ms=3.5, lw=1.6,
                    label=f"{ev.label} ({o['n_tokens']:,} tokens, {o['bits_per_base']:.3f} bits/base)")
            ax.fill_between(x, lo, hi, color=color, alpha=0.18, lw=0)
        _context_axis(ax)
        ax.set_title(what, fontsize=11)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    axes[0].set_ylabel("loss (bits per base)")
    _nats_axis(axes[1])
    fig.suptitle(f"{title} (shaded: 95% CI)")
    return fig


def plot_training_curves(runs: list[RunMetrics], title: str = "Training") -> Figure:
    """2 x 2 panels against optimizer step: loss, learning rate, throughput, peak memory."""
    fig = Figure(figsize=(11, 7), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True)
    panels = [("loss", "training loss (nats per token)", 1.0), ("lr", "learning rate", 1.0),
              ("tokens_per_s", "throughput (tokens/s)", 1.0), ("peak_mem_bytes", "peak memory (GiB)", 2.0**-30)]
    for ax, (col, label, scale) in zip(axes.flat, panels):
        for i, run in enumerate(runs):
            step, y = run.columns["step"], run.columns[col] * scale
            ok = np.isfinite(step) & np.isfinite(y)
            ax.plot(step[ok], y[ok], "-", marker="." if ok.sum() < 50 else None, color=COLORS[i % len(COLORS)],
                    lw=1.5, label=run.label)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("optimizer step")
    axes[0, 1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    axes[0, 0].legend(fontsize=9)
    fig.suptitle(title)
    return fig


def plot_context_gain(gain: ContextGain, title: str = "Is the gain from context, or from more training?") -> Figure:
    """Left: the three paired changes over all tokens, with 95% CIs; right: the same per context bucket."""
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.6])
    left.axvline(0, color="0.3", lw=1)
    right.axhline(0, color="0.3", lw=1)
    for i, (b, a, what) in enumerate(PAIRS):
        r, color = gain.pairs[b, a].result, COLORS[(i + 2) % len(COLORS)]
        o = r["overall"]
        if o["rel_change_pct"] is not None:
            lo, hi = o["rel_ci_low"], o["rel_ci_high"]
            err = None if lo is None or hi is None else [[o["rel_change_pct"] - lo], [hi - o["rel_change_pct"]]]
            left.errorbar(o["rel_change_pct"], -i, xerr=err, fmt="o", color=color, ms=7, capsize=5, lw=2)
            left.annotate(f"{o['rel_change_pct']:+.2f}%", (o["rel_change_pct"], -i), xytext=(0, 9),
                          textcoords="offset points", ha="center", fontsize=9, color=color)
        x, y, lo, hi = _series(r["buckets"], "rel_change_pct", "rel_ci_low", "rel_ci_high")
        right.plot(x, y, "-o", color=color, ms=3.5, lw=1.7, label=f"{b} vs {a} ({what})")
        right.fill_between(x, lo, hi, color=color, alpha=0.16, lw=0)
    left.set_yticks([-i for i in range(len(PAIRS))], [f"{b} vs {a}\n({what})" for b, a, what in PAIRS])
    left.set_ylim(-len(PAIRS) + 0.5, 0.6)
    left.margins(x=0.2)
    if (short := gain.training.get("short")) and short.seq_len:
        right.axvline(short.seq_len, color="0.5", ls=":", lw=1.2)
        right.annotate(f"short fine-tune's context ({_tokens(short.seq_len)})", (short.seq_len, 1), xytext=(3, -3),
                       xycoords=("data", "axes fraction"), textcoords="offset points", va="top", fontsize=8,
                       color="0.35")
    left.set_xlabel("change in held-out loss, all tokens (%)\nbelow 0: the first model is better")
    left.grid(True, axis="x", alpha=0.3)
    left.set_title("all tokens (bars: paired 95% CI)", fontsize=10)
    _context_axis(right)
    right.set_ylabel("change in loss (%)")
    right.set_title("by preceding context (shaded: paired 95% CI)", fontsize=10)
    right.legend(loc="best", fontsize=8)
    fig.suptitle(title)
    return fig


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
