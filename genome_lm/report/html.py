"""`genome-lm report`: one self-contained HTML page (PNG plots embedded as base64 data URIs).

    write_report(["evals/base", "evals/longctx", "evals/base_vs_longctx"], runs=["runs/demo_base"],
                 out="reports/demo.html")
"""

from __future__ import annotations

import base64
import html
import logging
import time
from pathlib import Path

from genome_lm.errors import GenomeLMError
from genome_lm.report import plots, tables
from genome_lm.report.data import CompareResult, implied_compares, load_dirs, load_run
from genome_lm.utils import atomic_file

log = logging.getLogger(__name__)

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; line-height: 1.45; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
figure { margin: 1em 0; } figure img { max-width: 100%; } figcaption { color: #555; font-size: 0.9em; }
table.glm { border-collapse: collapse; margin: 1em 0; font-size: 0.88em; }
table.glm caption { text-align: left; font-weight: 600; padding-bottom: 0.4em; }
table.glm th, table.glm td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
table.glm th { background: #f3f3f3; } table.glm td:first-child { text-align: left; }
.headline { background: #f4f8fb; border-left: 4px solid #1f77b4; padding: 0.6em 1em; }
.meta { color: #666; font-size: 0.85em; }
"""


def _figure(fig, alt: str, caption: str) -> str:
    data = base64.b64encode(plots.figure_png(fig)).decode("ascii")
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def headline(compares: list[CompareResult]) -> str:
    lines = []
    for cmp in compares:
        o = cmp.result["overall"]
        if o["rel_change_pct"] is None:
            continue
        text = (f"{cmp.label}: {o['rel_change_pct']:+.2f}% held-out loss (95% CI {o['rel_ci_low']:+.2f} to "
                f"{o['rel_ci_high']:+.2f}%) over {o['n_tokens']:,} tokens")
        best = cmp.result["concentration"]["largest_relative_gain"]
        if best:
            text += (f"; largest relative change at context [{best['lo']:,}, {best['hi']:,}) tokens: "
                     f"{best['rel_change_pct']:+.2f}%")
        lines.append(f"<p>{html.escape(text)}</p>")
    return f'<div class="headline">{"".join(lines)}</div>' if lines else ""


def build_report(dirs: list[str | Path], runs: list[str | Path] = (),
                 title: str = "genome_lm: loss by preceding context") -> str:
    """The report page as an HTML string."""
    evals, compares = load_dirs(list(dirs))
    run_metrics = [load_run(r) for r in runs]
    if not evals and not compares and not run_metrics:
        raise GenomeLMError("nothing to report: give eval or compare directories (and/or --run RUN_DIR)")
    if not compares and len(evals) >= 2:
        compares = implied_compares(evals)
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<p class="meta">generated {time.strftime("%Y-%m-%d %H:%M:%S")}; losses in bits per base '
             "(= nats per token / ln 2); context = tokens of sequence preceding the scored token</p>",
             headline(compares)]
    if evals:
        items = "".join(
            f"<li><b>{html.escape(e.label)}</b>: {html.escape(str(e.dir))} &mdash; checkpoint "
            f"{html.escape(str(e.summary.get('checkpoint', {}).get('path', '?')))}, "
            f"{e.summary['overall']['n_tokens']:,} tokens in "
            f"{e.summary.get('shards', {}).get('n_windows', '?')} windows, "
            f"{e.summary['overall']['bits_per_base']:.4f} bits/base</li>" for e in evals)
        parts += ["<h2>Evals</h2>", f"<ul>{items}</ul>",
                  "<h2>Loss vs preceding context</h2>",
                  _figure(plots.plot_loss_by_context(evals), "loss vs preceding context",
                          "Mean held-out loss of the tokens in each context bucket [lo, hi), plotted at the bucket's "
                          "mean context; bands: 95% CI from a bootstrap over windows.")]
    if compares:
        parts += ["<h2>Relative change vs preceding context</h2>",
                  _figure(plots.plot_relative_change(compares), "relative change vs context",
                          "100 x (mean loss B / mean loss A - 1) per context bucket on the same tokens; bands: paired "
                          "bootstrap 95% CI over windows. Below zero: B is better.")]
    if evals:
        parts += ["<h2>Repeat-masked vs unmasked bases</h2>",
                  _figure(plots.plot_repeat_split(evals), "repeat vs non-repeat",
                          "Loss by context on bases outside repeats (left) and on soft-masked repeat bases (right)."),
                  tables.repeat_table(evals)]
    if run_metrics:
        parts += ["<h2>Training curves</h2>",
                  _figure(plots.plot_training_curves(run_metrics), "training curves", "From each run's metrics.jsonl."),
                  tables.run_table(run_metrics)]
    parts.append("<h2>Tables</h2>")
    parts += [tables.compare_table(c) for c in compares]
    parts += [tables.bucket_table(e) for e in evals]
    parts += [tables.parity_table(e) for e in evals]
    body = "\n".join(p for p in parts if p)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def write_report(dirs: list[str | Path], out: str | Path, runs: list[str | Path] = (), **kwargs) -> Path:
    """build_report(...) -> `out`, written to a temporary name and renamed."""
    page = build_report(dirs, runs, **kwargs)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(out, encoding="utf-8") as f:
            f.write(page)
    except OSError as e:
        raise GenomeLMError(f"cannot write {out}: {e.strerror}; choose a writable --out") from None
    log.info("report -> %s (%d kB)", out, len(page) // 1024)
    return out
