"""The report's three questions: does the model read distant sequence (`eval --context`)? does it hold on the
other strand (`--strands both`)? is the held-out chromosome held out (leakage and `--annotate` strata)? Each
has a figure, an HTML table and a reading, in bits per base; each is None where no eval has the section."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from genome_lm.eval.stats import LN2
from genome_lm.report.data import EvalResult, windows_text
from genome_lm.report.matched import change_in_words
from genome_lm.report.plots import COLORS, _context_axis, _tokens
from genome_lm.report.tables import _bits, _num, _table


def _ci(lo, hi) -> str:
    return f"[{_num(_bits(lo), '{:+.4f}')}, {_num(_bits(hi), '{:+.4f}')}]"


def _bits_ci(entries: list[dict], key: str = "mean_nll") -> tuple[np.ndarray, list[np.ndarray]]:
    """entries[key], ci_low, ci_high in bits (None -> NaN): the values and matplotlib's yerr."""
    def col(k):
        return np.array([np.nan if e[k] is None else e[k] / LN2 for e in entries])

    y, lo, hi = col(key), col("ci_low"), col("ci_high")
    return y, [y - lo, hi - y]


def _with(evals: list[EvalResult], key: str) -> list[EvalResult]:
    return [ev for ev in evals if isinstance(ev.summary.get(key), dict) and "absent" not in ev.summary[key]]


def plot_context_ablation(evals: list[EvalResult]) -> Figure | None:
    """Per eval, left: loss of the fixed targets vs L; right: the paired change from the previous L, the
    panel that says whether added context helps (the left CIs mostly hold variation between windows)."""
    if not (evals := _with(evals, "context_ablation")):
        return None
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax, dx = fig.subplots(1, 2)
    for i, ev in enumerate(evals):
        ab = ev.summary["context_ablation"]
        rows, color = ab["by_length"], COLORS[i % len(COLORS)]
        x = np.array([r["L"] for r in rows], dtype=float)
        y, yerr = _bits_ci(rows)
        ax.errorbar(x, y, yerr=yerr, marker="o", capsize=3, color=color, label=ev.label)
        if steps := ab["paired_differences"]:
            shift = 2 ** (0.06 * (i - (len(evals) - 1) / 2))  # side by side on the log axis
            xs = np.array([d["to"] for d in steps], dtype=float) * shift
            d, derr = _bits_ci(steps, "mean_delta")
            dx.errorbar(xs, d, yerr=derr, marker="o", capsize=3, ls="none", color=color, label=ev.label)
    ticks = sorted({r["L"] for ev in evals for r in ev.summary["context_ablation"]["by_length"]})
    for a in (ax, dx):
        _context_axis(a)
        a.set_xticks(ticks)
        a.set_xlabel("preceding context given to the same target tokens (L, log scale)")
    ax.set_ylabel("bits per base")
    ax.set_title("Context ablation: the same target tokens given L tokens")
    ax.legend()
    dx.axhline(0.0, color="black", lw=0.8)
    dx.set_ylabel("change from the previous L (bits per base)")
    dx.set_title("Paired change from the previous L (< 0: context helps)")
    return fig


def context_ablation_table(evals: list[EvalResult]) -> str | None:
    """Per eval and L: mean loss with CI, and the paired change from the previous L (same tokens)."""
    if not (evals := _with(evals, "context_ablation")):
        return None
    rows = []
    for ev in evals:
        ab = ev.summary["context_ablation"]
        deltas = {d["to"]: d for d in ab["paired_differences"]}
        for r in ab["by_length"]:
            d = deltas.get(r["L"])
            change = "" if d is None else f"{_num(_bits(d['mean_delta']), '{:+.4f}')} {_ci(d['ci_low'], d['ci_high'])}"
            rows.append([ev.label, _tokens(r["L"]), f"{r['tokens']:,}", _num(r["mean_nll"] / LN2),
                         _ci(r["ci_low"], r["ci_high"]).replace("+", ""), change])
    return _table(["eval", "L", "target tokens", "bits/base", "95% CI", "change from previous L (paired, 95% CI)"],
                  rows, "Context ablation: fixed target tokens (the end of each window) scored with L preceding tokens")


def context_ablation_reading(evals: list[EvalResult]) -> str | None:
    """Per eval, the paired change from the shortest L to the longest (`span`, else the first step)."""
    if not (evals := _with(evals, "context_ablation")):
        return None
    parts = []
    for ev in evals:
        ab = ev.summary["context_ablation"]
        if not ab["paired_differences"]:
            continue
        d = ab.get("span") or ab["paired_differences"][0]
        parts.append(f"{ev.label}: {_tokens(d['from'])} → {_tokens(d['to'])} changes the loss of the same "
                     f"{d['tokens']:,} tokens by {_num(_bits(d['mean_delta']), '{:+.4f}')} bits/base "
                     f"{_ci(d['ci_low'], d['ci_high'])} ({change_in_words(d['ci_low'], d['ci_high'])})")
    n = evals[0].summary["context_ablation"]
    return (f"On {n['target_tokens']:,} target tokens in {windows_text(evals[0].summary)}, a model that reads distant "
            "sequence gets better as L grows; position in the window plays no part here. " + "; ".join(parts) + ".")


def _bars(evals: list[EvalResult], section: str, names: tuple, ticks: list[str], title: str):
    """(fig, ax): per eval, a bar per class `names` of summary[section] (overall loss, 95% CIs)."""
    fig = Figure(figsize=(8.5, 4))
    ax = fig.add_subplot()
    width = 0.8 / len(evals)
    for i, ev in enumerate(evals):
        y, yerr = _bits_ci([ev.summary[section][k]["overall"] for k in names])
        x = np.arange(len(names)) + (i - (len(evals) - 1) / 2) * width
        ax.bar(x, y, width, yerr=yerr, capsize=3, color=COLORS[i % len(COLORS)], label=ev.label)
    ax.set_xticks(np.arange(len(names)), ticks)
    ax.set_ylabel("bits per base")
    ax.set_title(title)
    ax.legend()
    return fig, ax


def plot_strands(evals: list[EvalResult]) -> Figure | None:
    """Per eval: overall loss on the forward strand, the reverse complement and both, with 95% CIs."""
    if not (evals := _with(evals, "strands")):
        return None
    names = ("forward", "reverse", "average")
    fig, ax = _bars(evals, "strands", names, ["forward strand", "reverse complement", "both"], "Both strands")
    overall = [ev.summary["strands"][k]["overall"] for ev in evals for k in names]
    ymin = min(o["mean_nll"] if o["ci_low"] is None else o["ci_low"] for o in overall) / LN2  # no CI: one window
    ax.set_ylim(bottom=max(0.0, ymin - 0.05))
    return fig


def strands_table(evals: list[EvalResult]) -> str | None:
    """Per eval: loss per strand and pooled, and the per-base agreement (Pearson r, mean |Δ|)."""
    if not (evals := _with(evals, "strands")):
        return None
    rows = []
    for ev in evals:
        st = ev.summary["strands"]
        g = st["agreement"]["overall"]
        tabs = [st[k]["overall"] for k in ("forward", "reverse", "average")]
        cells = [f"{_num(t['mean_nll'] / LN2)} {_ci(t['ci_low'], t['ci_high']).replace('+', '')}" for t in tabs]
        rows.append([ev.label, *cells, f"{st['average']['overall']['n_tokens']:,}",
                     f"{_num(g['pearson_r'], '{:.3f}')} [{_num(g['pearson_ci_low'], '{:.3f}')}, "
                     f"{_num(g['pearson_ci_high'], '{:.3f}')}]",
                     _num(_bits(g["mean_abs_diff"]))])
    return _table(["eval", "forward (bits/base, 95% CI)", "reverse complement", "both", "tokens (both)",
                   "per-base agreement r", "mean |Δ| (bits)"], rows,
                  "Both strands: each window and its reverse complement; agreement = the same base scored from "
                  "each side")


def strands_reading(evals: list[EvalResult]) -> str | None:
    if not (evals := _with(evals, "strands")):
        return None
    parts = []
    for ev in evals:
        st = ev.summary["strands"]
        f, r = st["forward"]["overall"], st["reverse"]["overall"]
        parts.append(f"{ev.label}: forward {_num(f['mean_nll'] / LN2)} vs reverse {_num(r['mean_nll'] / LN2)} "
                     f"bits/base, per-base r = {_num(st['agreement']['overall']['pearson_r'], '{:.3f}')}")
    n = evals[0].summary["strands"]["average"]["overall"]["n_tokens"]
    return (f"A model without a preferred direction scores a window and its reverse complement alike ({n:,} tokens "
            "over both strands; agreement compares the same base seen with its 5' and its 3' context, so it is lower "
            "near window ends): " + "; ".join(parts) + ".")


def plot_leakage(evals: list[EvalResult]) -> Figure | None:
    """Per eval: loss on tokens inside a training K-mer vs the rest, 95% CIs."""
    if not (evals := _with(evals, "leakage")):
        return None
    ticks = ["not in a training K-mer", "in a training K-mer (prepare --leakage-k)"]
    title = "Is the held-out chromosome held out? Loss with and without shared K-mers"
    return _bars(evals, "leakage", ("unmasked", "masked"), ticks, title)[0]


def strata_table(evals: list[EvalResult]) -> str | None:
    """Per eval: the leakage classes and every annotation's in / out, with tokens and CIs."""
    rows = []
    for ev in evals:
        lk = ev.summary.get("leakage")
        classes = [("leakage", "shared with training", lk["masked"]), ("leakage", "not shared", lk["unmasked"])] \
            if isinstance(lk, dict) else []
        classes += [(name, c, t[c]) for name, t in (ev.summary.get("annotations") or {}).items() for c in ("in", "out")]
        for stratum, cls, t in classes:
            o = t["overall"]
            rows.append([ev.label, stratum, cls, f"{o['n_tokens']:,}", _num(_bits(o["mean_nll"])),
                         _ci(o["ci_low"], o["ci_high"]).replace("+", "")])
    if not rows:
        return None
    return _table(["eval", "stratum", "class", "tokens", "bits/base", "95% CI"], rows,
                  "Loss by stratum: leakage (K-mers shared with the training chromosomes) and --annotate BED files")


def leakage_reading(evals: list[EvalResult]) -> str | None:
    if not (evals := _with(evals, "leakage")):
        return None
    lk = evals[0].summary["leakage"]
    masked, unmasked = lk["masked"]["overall"]["n_tokens"], lk["unmasked"]["overall"]["n_tokens"]
    frac = masked / max(1, masked + unmasked)
    parts = [f"{ev.label}: {_num(_bits(ev.summary['leakage']['masked']['overall']['mean_nll']))} on shared vs "
             f"{_num(_bits(ev.summary['leakage']['unmasked']['overall']['mean_nll']))} bits/base on the rest"
             for ev in evals]
    return (f"{masked:,} of {masked + unmasked:,} scored tokens ({100 * frac:.1f}%) lie in a K-mer that also occurs in "
            "the training chromosomes; a much lower loss there measures memorised training sequence, and the "
            "'not shared' numbers are the held-out result: " + "; ".join(parts) + ".")
