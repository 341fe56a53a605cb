"""Report tables as HTML strings (shown in the report page and in notebooks via IPython.display.HTML)."""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np

from genome_lm.eval.stats import LN2
from genome_lm.report.data import CompareResult, EvalResult, RunMetrics
from genome_lm.report.matched import PAIRS, ROLES, ContextGain


def _table(header: list[str], rows: list[list[str]], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<table class="glm">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _num(x, fmt: str = "{:.4f}") -> str:
    """`x` formatted, or an en dash (a character, not an entity: prose is HTML-escaped) when it is missing."""
    return "\u2013" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _range(lo, hi, fmt: str = "{:.4f}") -> str:
    return f"{_num(lo, fmt)} &ndash; {_num(hi, fmt)}"


def _bits(x):
    """nats -> bits, keeping None (and 0.0)."""
    return x and x / LN2


def _label(b: dict) -> str:
    """A bucket's context range, or 'all' for an overall entry (no 'lo')."""
    return "<b>all</b>" if b.get("lo") is None else f"[{b['lo']:,}, {b['hi']:,})"


def _rows(table: dict) -> list[dict]:
    """The buckets with tokens, then the overall entry (lo None) if it has any."""
    return [b for b in table["buckets"] + [dict(table["overall"], lo=None)] if b["n_tokens"]]


def bucket_table(ev: EvalResult) -> str:
    """Per bucket: tokens, windows, nats/token, bits/base and the 95% CI (bits/base)."""
    s = ev.summary
    rows = [[_label(b), f"{b['n_tokens']:,}", str(b.get("n_windows", "")), _num(b["mean_nll"]),
             _num(b["bits_per_base"]), _range(_bits(b["ci_low"]), _bits(b["ci_high"]))] for b in _rows(s)]
    cfg = s.get("config", {})
    caption = (f"{ev.label}: loss by preceding context (checkpoint {s.get('checkpoint', {}).get('path', '?')}, "
               f"seq_len {cfg.get('seq_len', '?')}, engine {cfg.get('engine', '?')})")
    return _table(["context (tokens)", "tokens", "windows", "nats/token", "bits/base", "95% CI (bits/base)"], rows,
                  caption)


def repeat_table(evals: list[EvalResult]) -> str:
    """Overall loss on unmasked vs repeat-masked bases, one row per eval."""
    parts = [[ev.summary["repeat"][name]["overall"] for name in ("unmasked", "masked")] for ev in evals]
    rows = [[html.escape(ev.label)] + [c for o in sides for c in (f"{o['n_tokens']:,}", _num(o["bits_per_base"]))]
            for ev, sides in zip(evals, parts)]
    return _table(["eval", "unmasked tokens", "unmasked bits/base", "repeat-masked tokens", "repeat-masked bits/base"],
                  rows, "Repeat-masked (soft-masked) vs unmasked bases, all contexts")


def compare_table(cmp: CompareResult) -> str:
    """Per bucket: A and B in nats/token, B - A, relative change with its paired 95% CI, gain share."""
    r = cmp.result
    rows = [[_label(b), f"{b['n_tokens']:,}", _num(b["mean_nll_a"]), _num(b["mean_nll_b"]), _num(b["diff"], "{:+.4f}"),
             _num(b["rel_change_pct"], "{:+.2f}%"), _range(b["rel_ci_low"], b["rel_ci_high"], "{:+.2f}"),
             _num(b.get("gain_share"), "{:.1%}") if b.get("lo") is not None else ""] for b in _rows(r)]
    caption = f"{cmp.label}: A = {r['a']['dir']}, B = {r['b']['dir']} (negative change: B has lower loss)"
    return _table(["context (tokens)", "tokens", "A nats/token", "B nats/token", "B - A", "change", "95% CI (%)",
                   "share of gain"], rows, caption)


def replicates_table(cmp: CompareResult) -> str:
    """A compare's replicate pairs, then the pooled change with CIs over pairs and windows; '' without any."""
    rep = cmp.result.get("replicates")
    if not rep:
        return ""
    abl = rep.get("context_ablation")
    rows = []
    for i, p in enumerate(rep["pairs"], 1):
        span = p.get("ablation_span")
        rows.append([f"pair {i}: {html.escape(Path(p['b']).name)} vs {html.escape(Path(p['a']).name)}",
                     f"{p['n_tokens']:,}", _num(p["mean_nll_a"]), _num(p["mean_nll_b"]), _num(p["diff"], "{:+.4f}"),
                     _num(p["rel_change_pct"], "{:+.2f}%"), _range(p["rel_ci_low"], p["rel_ci_high"], "{:+.2f}")]
                    + ([_num(span["a"]["mean_delta"], "{:+.4f}"), _num(span["b"]["mean_delta"], "{:+.4f}")]
                       if abl else []))
    o, s = rep["overall"], rep["spread"]["rel_change_pct"]
    rows.append([f"<b>pooled</b> (CI over pairs, then windows; sd over pairs {_num(s['sd'], '{:.2f}')}%)", "", "", "",
                 _num(o["diff"], "{:+.4f}"), _num(o["rel_change_pct"], "{:+.2f}%"),
                 _range(o["rel_ci_low"], o["rel_ci_high"], "{:+.2f}")]
                + ([f"{_num(d['mean_delta'], '{:+.4f}')} ({_range(d['ci_low'], d['ci_high'], '{:+.4f}')})"
                    for d in (abl["a"], abl["b"])] if abl else []))
    span_head = [f"A: L {abl['from']:,} \u2192 {abl['to']:,} (nats)", f"B: L {abl['from']:,} \u2192 {abl['to']:,}"] \
        if abl else []
    return _table(["replicate pair", "tokens", "A nats/token", "B nats/token", "B - A", "change", "95% CI (%)"]
                  + span_head, rows,
                  f"{cmp.label}: {rep['n']} replicate pairs (training seeds); {s['negative']} of {rep['n']} changes "
                  "negative; the pooled CI covers the spread between seeds, each pair's only its windows")


def context_gain_table(gain: ContextGain) -> str:
    """The three models, then the three paired differences, B - A in bits/base and relative."""
    rows = []
    for role, name in ROLES.items():
        ev, t = gain.evals[role], gain.training.get(role)
        o = ev.summary["overall"]
        trained = "&ndash;" if t is None else f"{t.tokens:,} ({t.steps:,} steps at context {t.seq_len:,})"
        rows.append([f"<b>{name}</b> ({html.escape(ev.label)})", trained, f"{o['n_tokens']:,}",
                     str(ev.summary.get("shards", {}).get("n_windows", "")), _num(o["bits_per_base"]),
                     _range(_bits(o["ci_low"]), _bits(o["ci_high"])), ""])
    for b, a, what in PAIRS:
        r = gain.pairs[b, a].result
        d = r["overall"]
        rows.append([f"<b>{b} &minus; {a}</b> ({html.escape(what)})", "", f"{d['n_tokens']:,}", str(r["n_windows"]),
                     _num(_bits(d["diff"]), "{:+.4f}"),
                     _range(_bits(d["diff_ci_low"]), _bits(d["diff_ci_high"]), "{:+.4f}"),
                     f"{_num(d['rel_change_pct'], '{:+.2f}%')} "
                     f"({_range(d['rel_ci_low'], d['rel_ci_high'], '{:+.2f}')})"])
    return _table(["model / paired difference", "training tokens", "held-out tokens", "windows", "bits/base",
                   "95% CI (bits/base)", "change (95% CI, %)"], rows,
                  "Base, short- and long-context fine-tunes on the same held-out tokens (differences: paired "
                  "bootstrap over windows; long - short = the gain attributable to context)")


def parity_table(ev: EvalResult) -> str:
    p = ev.summary.get("parity")
    if not p:
        return ""
    rows = [[_label(b), f"{b['n_tokens']:,}", _num(b["max_abs_diff"], "{:.2e}"), _num(b["mean_abs_diff"], "{:.2e}")]
            for b in [b for b in p["buckets"] if b["n_tokens"]] + [p["overall"]]]  # the overall row even if empty
    return _table(["context (tokens)", "tokens", "max |&Delta; log-prob|", "mean |&Delta; log-prob|"], rows,
                  f"{ev.label}: log-prob parity, {' vs '.join(p['engines'])} (nats)")


def run_table(runs: list[RunMetrics]) -> str:
    rows = []
    for run in runs:
        c = run.columns
        last = lambda k: c[k][np.isfinite(c[k])][-1] if np.isfinite(c[k]).any() else None  # noqa: E731
        agg = lambda f, k: f(c[k][np.isfinite(c[k])]) if np.isfinite(c[k]).any() else None  # noqa: E731
        peak, per_step, steps = agg(np.max, "peak_mem_bytes"), agg(np.median, "tokens"), last("step")
        rows.append([html.escape(run.label), _num(steps, "{:.0f}"),
                     _num(per_step and steps and per_step * steps, "{:,.0f}"),
                     _num(c["loss"][0] if len(c["loss"]) else None),
                     _num(last("loss")), _num(agg(np.median, "tokens_per_s"), "{:,.0f}"),
                     _num(peak and peak / 2**30, "{:.2f}")])
    return _table(["run", "steps", "tokens (steps x tokens/step)", "first loss", "last loss", "median tokens/s",
                   "peak memory (GiB)"], rows, "Training runs (metrics.jsonl)")


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
