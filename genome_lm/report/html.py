"""`genome-lm report`: one self-contained HTML page (PNG plots embedded as base64 data URIs), with the
sections of docs/report.md."""

from __future__ import annotations

import base64
import html
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from genome_lm.errors import GenomeLMError
from genome_lm.outputs import KINDS, atomic_file, holding, read_marker
from genome_lm.report import plots, questions, tables
from genome_lm.report.data import (
    CompareResult,
    EvalResult,
    implied_compares,
    load_dirs,
    load_eval,
    load_run,
    windows_text,
)
from genome_lm.report.matched import ContextGain, context_gain, find_roles, reading, rel_ci_text, same_path

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


def headline(compares: list[CompareResult], gain: ContextGain | None = None, seeds: CompareResult | None = None) -> str:
    """The page's opening lines: the context-vs-training reading, then each compare's overall change."""
    lines = [f"<p><b>{html.escape(reading(gain, seeds))}</b></p>"] if gain else []
    for cmp in compares:
        o = cmp.result["overall"]
        if o["rel_change_pct"] is None:
            continue
        text = (f"{cmp.label}: {o['rel_change_pct']:+.2f}% held-out loss (95% CI {rel_ci_text(o)}) "
                f"over {o['n_tokens']:,} tokens")
        if best := cmp.result["concentration"]["largest_relative_gain"]:
            text += (f"; largest relative change at context [{best['lo']:,}, {best['hi']:,}) tokens: "
                     f"{best['rel_change_pct']:+.2f}%")
        lines.append(f"<p>{html.escape(text)}</p>")
    return f'<div class="headline">{"".join(lines)}</div>' if lines else ""


def _context_gain(evals: list[EvalResult], compares: list[CompareResult],
                  matched: tuple | None) -> ContextGain | None:
    """The three-way comparison of `matched` (added to `evals` if missing), else of `find_roles`' roles."""
    if matched is not None:
        if len(matched) != 3:
            raise GenomeLMError(f"matched takes 3 eval directories (base, short, long), got {len(matched)}")
        picked = []
        for d in matched:
            if (ev := next((e for e in evals if same_path(e.dir, d)), None)) is None:
                evals.append(ev := load_eval(d))
            picked.append(ev)
        base, short, long = picked
        return context_gain(base, short, long, compares=compares)
    if (roles := find_roles(evals)) is None:
        return None
    try:
        return context_gain(*roles, compares=compares)
    except GenomeLMError as e:
        log.warning("no base / short / long comparison of %s: %s", ", ".join(ev.label for ev in roles), e)
        return None


def _context_gain_section(gain: ContextGain, seeds: CompareResult | None = None) -> list[str]:
    """The section on context vs more training, with the replicate compare `seeds` if any."""
    o = {role: ev.summary["overall"] for role, ev in gain.evals.items()}
    tokens = (f"Each model's loss rests on its {o['base']['n_tokens']:,} held-out tokens in "
              f"{windows_text(gain.evals['base'].summary)} (95% CI: "
              f"bootstrap over windows); each difference on the tokens both models scored "
              f"({gain.pairs['long', 'short'].result['overall']['n_tokens']:,}), with a paired bootstrap over the same "
              "windows.")
    short, long = gain.training.get("short"), gain.training.get("long")
    if short and long:
        tokens += (f" The short-context fine-tune trained on {short.tokens:,} tokens ({short.steps:,} steps "
                   f"at context {short.seq_len:,}), the long-context one on {long.tokens:,} "
                   f"({long.steps:,} steps at context {long.seq_len:,}).")
    return ["<h2>Is the gain from context, or from more training?</h2>",
            f'<p class="headline">{html.escape(reading(gain, seeds))}</p>',
            "<p>The long-context fine-tune also trained on more tokens than the base. The control is the same base "
            "fine-tuned on the same number of tokens at the base's context: short vs base is what more training "
            "alone does, long vs short what the context adds.</p>",
            f"<p>{html.escape(tokens)}</p>",
            _figure(plots.plot_context_gain(gain), "context vs more training",
                    "Left: change in held-out loss over all tokens, 100 x (mean loss of the first model / mean loss "
                    "of the second - 1), with paired 95% bootstrap CIs over windows. Right: the same per context "
                    "bucket."),
            tables.context_gain_table(gain)] + (
               [tables.replicates_table(seeds)] if seeds else [])


def _questions_sections(evals: list[EvalResult]) -> list[str]:
    """One section per question of `questions.py` the evals can answer."""
    out = []
    for title, alt, caption, plot, read, table in (
            ("Does the model read distant sequence? (context ablation)", "context ablation",
             "The same target tokens (the end of each window) scored with exactly L preceding tokens (eval --context); "
             "error bars: 95% bootstrap CI over windows. Position in the window plays no part: a falling curve means "
             "the model uses the added distant sequence.",
             questions.plot_context_ablation, questions.context_ablation_reading, questions.context_ablation_table),
            ("Does it hold on the other strand?", "both strands",
             "Overall loss on each window (forward strand), its reverse complement, and both pooled (eval --strands "
             "both); error bars: 95% bootstrap CI over windows.",
             questions.plot_strands, questions.strands_reading, questions.strands_table),
            ("Is the held-out chromosome really held out? (leakage and annotation strata)", "leakage",
             "Loss on eval tokens covered by an exact K-mer that also occurs in a training chromosome (prepare "
             "--leakage-k, either strand) and on the rest; error bars: 95% bootstrap CI.",
             questions.plot_leakage, questions.leakage_reading, questions.strata_table)):
        if not (found := table(evals)):
            continue
        out.append(f"<h2>{html.escape(title)}</h2>")
        if text := read(evals):
            out.append(f'<p class="headline">{html.escape(text)}</p>')
        if (fig := plot(evals)) is not None:
            out.append(_figure(fig, alt, caption))
        out.append(found)
    return out


def _variants_section(v: EvalResult) -> list[str]:
    """The section "variant effect by context" of a `genome-lm variants` output (counts only without labels)."""
    s, counts = v.summary, v.summary["variants"]
    skipped = ", ".join(f"{n:,} {why.replace('_', ' ')}" for why, n in counts.get("skipped", {}).items() if n)
    text = (f"{v.label}: {counts.get('scored', 0):,} of {counts.get('read', 0):,} variants scored"
            f"{' (skipped: ' + skipped + ')' if skipped else ''} at contexts "
            f"{', '.join(f'{c:,}' for c in s['contexts'])}, scored over the variant and {s.get('after', 0):,} bases "
            f"after it; score = log P(alt) - log P(ref) given exactly L bases before it.")
    out = ["<h2>Variant effect by context</h2>", f"<p>{html.escape(text)}</p>"]
    if not s["metrics"]:
        return out + ["<p>No labels were given (variants --labels / --labels-tsv): no AUROC.</p>"]
    return out + [_figure(plots.plot_roc(v), "ROC by context",
                          "ROC curve of -score per context L (label 1 = positive)."),
                  _figure(plots.plot_score_shift(v), "score shift vs context",
                          "Mean variant score by context length, for positive and benign variants and all."),
                  tables.metrics_table(v)]


def _shards_note(evals) -> str:
    """A warning (also logged) when the evals' shard manifests differ, else ''."""
    by_shards: dict[str, list[str]] = {}
    for e in evals:
        by_shards.setdefault(e.summary.get("shards", {}).get("manifest_sha256", "?"), []).append(e.label)
    if len(by_shards) < 2:
        return ""
    groups = "; ".join(f"{', '.join(labels)}: manifest sha256 {sha[:12]}" for sha, labels in by_shards.items())
    note = f"These evals scored different shards ({groups}); their losses are not of the same tokens."
    log.warning("report: %s", note)
    return f'<p class="headline">{html.escape(note)}</p>'


def build_report(dirs: Sequence[str | Path], runs: Sequence[str | Path] = (),
                 title: str = "genome_lm: loss by preceding context", matched: tuple | None = None) -> str:
    """The report page as an HTML string; `matched`: (base, short, long) eval directories."""
    evals, compares, variant_runs = load_dirs(dirs)
    run_metrics = [load_run(r) for r in runs]
    if not evals and not compares and not run_metrics and not variant_runs and matched is None:
        raise GenomeLMError("nothing to report: give eval or compare directories (and/or --run RUN_DIR)")
    gain = _context_gain(evals, compares, matched)
    if not compares and len(evals) >= 2:
        compares = list(gain.pairs.values()) if gain else implied_compares(evals)
    # long vs short over training seeds (`compare SHORT,... LONG,...`), read with the three
    seeds = next((c for c in compares if c.result.get("replicates")
                  and same_path(c.result["a"]["dirs"][0], gain.evals["short"].dir)
                  and same_path(c.result["b"]["dirs"][0], gain.evals["long"].dir)), None) if gain else None
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<p class="meta">generated {time.strftime("%Y-%m-%d %H:%M:%S")}; losses in bits per base '
             "(= nats per token / ln 2); context = tokens of sequence preceding the scored token</p>",
             headline(compares, gain, seeds)]
    if evals:
        items = "".join(
            f"<li><b>{html.escape(e.label)}</b>: {html.escape(str(e.dir))} &mdash; checkpoint "
            f"{html.escape(str(e.summary.get('checkpoint', {}).get('path', '?')))}, "
            f"{e.summary['overall']['n_tokens']:,} tokens in {windows_text(e.summary)}, "
            f"{e.summary['overall']['bits_per_base']:.4f} bits/base</li>" for e in evals)
        parts += ["<h2>Evals</h2>", f"<ul>{items}</ul>", _shards_note(evals),
                  "<h2>Loss vs preceding context</h2>",
                  _figure(plots.plot_loss_by_context(evals), "loss vs preceding context",
                          "Mean held-out loss of the tokens in each context bucket [lo, hi), plotted at the bucket's "
                          "mean context; bands: 95% CI from a bootstrap over windows.")]
    if compares:
        parts += ["<h2>Relative change vs preceding context</h2>",
                  _figure(plots.plot_relative_change(compares), "relative change vs context",
                          "100 x (mean loss B / mean loss A - 1) per context bucket on the same tokens; bands: paired "
                          "bootstrap 95% CI over windows. Below zero: B is better.")]
    if gain:
        parts += _context_gain_section(gain, seeds)
    if evals:
        parts += _questions_sections(evals)
        parts += ["<h2>Repeat-masked vs unmasked bases</h2>",
                  _figure(plots.plot_repeat_split(evals), "repeat vs non-repeat",
                          "Loss by context on bases outside repeats (left) and on soft-masked repeat bases (right)."),
                  tables.repeat_table(evals)]
    for v in variant_runs:
        parts += _variants_section(v)
    if run_metrics:
        parts += ["<h2>Training curves</h2>",
                  _figure(plots.plot_training_curves(run_metrics), "training curves", "From each run's metrics.jsonl."),
                  tables.run_table(run_metrics)]
    parts += ["<h2>Tables</h2>"] if evals or compares else []
    parts += [t for c in compares for t in (tables.compare_table(c), "" if c is seeds else tables.replicates_table(c))]
    parts += [tables.bucket_table(e) for e in evals]
    parts += [tables.parity_table(e) for e in evals]
    body = "\n".join(p for p in parts if p)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{GENERATOR}'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


GENERATOR = '<meta name="generator" content="genome_lm report">'


def claim_report(out: Path, overwrite: bool) -> None:
    """Refuse an `out` that a report may not replace (a folder, a file that is not a report or HTML page)."""
    if out.is_dir():
        raise GenomeLMError(f"--out {out} is a folder; give the HTML file to write (e.g. {out / 'report.html'})")
    if not out.exists():
        if (marker := read_marker(out.parent)) is not None and marker["kind"] != "run":
            raise GenomeLMError(f"--out {out} lies inside {KINDS[marker['kind']]}, which its command's --overwrite "
                                f"replaces whole; write the report beside it, e.g. --out "
                                f"{out.parent.parent / out.name}")
        return
    if not overwrite:
        raise GenomeLMError(f"--out {out} already exists; pass --overwrite to replace it or choose another --out")
    with open(out, "rb") as f:
        head = f.read(4096)
    if GENERATOR.encode() not in head and out.suffix.lower() not in (".html", ".htm"):
        raise GenomeLMError(f"--out {out} is not a report (a {out.suffix or 'suffix-less'} file); --overwrite "
                            "replaces only a report or an HTML page: choose an .html path for --out")


def write_report(dirs: Sequence[str | Path], out: str | Path, runs: Sequence[str | Path] = (), overwrite: bool = False,
                 **kwargs) -> Path:
    """build_report(...) -> `out`, written to a temporary name and renamed (`claim_report` first)."""
    out = Path(out)
    with holding(out, "report"):
        claim_report(out, overwrite)
        page = build_report(dirs, runs, **kwargs)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(out, encoding="utf-8") as f:
                f.write(page)
        except OSError as e:
            raise GenomeLMError(f"cannot write {out}: {e.strerror}; choose a writable --out") from None
    log.info("report -> %s (%d kB)", out, len(page) // 1024)
    return out


def report_command(p) -> str:
    """`genome-lm report`: `p` its ReportParams."""
    return f"report: {write_report(p.dirs, p.out, runs=p.runs, title=p.title, overwrite=p.overwrite)}"
