"""Is the gain from context, or from more training? Three evals of the same windows: the base, and fine-tunes
of it at the base's short context and at long context on as many training tokens. short - base is more training
alone, long - base training + context, long - short the context; each is `compare_evals` of the pair (B - A),
or a compare directory of the same two evals given to the report."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.eval.compare import compare_evals
from genome_lm.eval.stats import LN2
from genome_lm.report.data import CompareResult, EvalResult, load_eval, load_run, windows_text

ROLES = {"base": "base", "short": "short-context fine-tune", "long": "long-context fine-tune"}
PAIRS = (("short", "base", "more training"), ("long", "base", "training + context"), ("long", "short", "context"))


@dataclass
class Training:
    """What a run trained; `seq_len`: the longest sequence (metrics.jsonl's `seq_tokens`, else data.seq_len)."""
    steps: int
    tokens: int  # steps x the median tokens per step
    seq_len: int
    init: str | None  # model.init of the run (None: from scratch)


@dataclass
class ContextGain:
    evals: dict[str, EvalResult]                        # role ("base", "short", "long") -> eval
    pairs: dict[tuple[str, str], CompareResult]         # (B role, A role) -> comparison, B - A
    training: dict[str, Training | None] = field(default_factory=dict)


def training_of(ev: EvalResult) -> Training | None:
    """The run whose checkpoint `ev` scored (RUN/checkpoints/X -> RUN), if its files are there."""
    import yaml

    ckpt = Path(ev.summary.get("checkpoint", {}).get("path") or "")
    run = ckpt.parent.parent
    if ckpt.parent.name != "checkpoints" or not (run / "config.yaml").is_file():
        return None
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
        c = load_run(run).columns
    except (OSError, ValueError, GenomeLMError, yaml.YAMLError):
        return None
    per_step, trained = c["tokens"][c["tokens"] > 0], c["seq_tokens"][c["seq_tokens"] > 0]
    if not per_step.size:
        return None
    seq_len = trained.max() if trained.size else cfg.get("data", {}).get("seq_len", 0)
    steps = int(c["step"][-1])
    return Training(steps=steps, tokens=steps * int(np.median(per_step)), seq_len=int(seq_len),
                    init=cfg.get("model", {}).get("init"))


def same_path(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` name the same file or folder (after resolving links and relative parts)."""
    return Path(a).resolve() == Path(b).resolve()


def context_gain(base: EvalResult | str | Path, short: EvalResult | str | Path, long: EvalResult | str | Path,
                 compares: Sequence[CompareResult] = (), **compare_kwargs) -> ContextGain:
    """The three evals (EvalResult or eval directories) and their three paired comparisons."""
    evals = {role: ev if isinstance(ev, EvalResult) else load_eval(ev)
             for role, ev in (("base", base), ("short", short), ("long", long))}
    pairs = {}
    for b, a, _ in PAIRS:
        found = next((cmp for cmp in compares if same_path(cmp.result["a"]["dir"], evals[a].dir)
                      and same_path(cmp.result["b"]["dir"], evals[b].dir)), None)
        if found is None:
            result = compare_evals(evals[a].dir, evals[b].dir, **compare_kwargs)
            found = CompareResult(f"{evals[b].label} vs {evals[a].label}", result)
        pairs[(b, a)] = found
    return ContextGain(evals, pairs, {role: training_of(ev) for role, ev in evals.items()})


def _init_is(init: str | None, model_dir: str) -> bool:
    """Whether a run's `model.init` is `model_dir` (or the export folder holding it as model/)."""
    p = Path(os.path.expandvars(init)).resolve() if init else None
    return p is not None and Path(model_dir).resolve() in (p, (p / "model").resolve())


def find_roles(evals: list[EvalResult]) -> tuple[EvalResult, EvalResult, EvalResult] | None:
    """(base, short, long): an eval whose checkpoint two others' runs started from, at different contexts."""
    runs = {id(ev): t for ev in evals if (t := training_of(ev)) is not None}  # the evals whose run is readable
    for base in evals:
        if not (model_dir := base.summary.get("checkpoint", {}).get("model_dir")):
            continue
        tuned = [ev for ev in evals if ev is not base and id(ev) in runs and _init_is(runs[id(ev)].init, model_dir)]
        if len(tuned) == 2 and runs[id(tuned[0])].seq_len != runs[id(tuned[1])].seq_len:
            short, long = sorted(tuned, key=lambda ev: runs[id(ev)].seq_len)
            return base, short, long
    return None


def _pct(o: dict, key: str = "rel_change_pct") -> str:
    return "n/a" if o.get(key) is None else f"{o[key]:+.2f}%"


def rel_ci_text(o: dict) -> str:
    lo, hi = o.get("rel_ci_low"), o.get("rel_ci_high")
    return "n/a" if lo is None or hi is None else f"{lo:+.2f} to {hi:+.2f}%"


def _verdict(o: dict, evidence: str = "these windows") -> str:
    """How a change with relative CI `o` reads; `evidence`: what the CI resamples."""
    words = {"no CI": ": no CI, which needs at least 2 eval windows.",
             "falls, CI clear of zero": ", its CI clear of zero.",
             "rises, CI clear of zero": ": the long-context model is worse, its CI clear of zero.",
             "CI includes zero": f": its CI includes zero, so {evidence} cannot tell it from no effect."}
    return words[change_in_words(o.get("rel_ci_low"), o.get("rel_ci_high"))]


def reading(gain: ContextGain, seeds: CompareResult | None = None) -> str:
    """The fine-tunes against the base and each other; with `seeds`, long vs short pooled over the seeds."""
    lb, sb, ls = (gain.pairs[p].result["overall"] for p in (("long", "base"), ("short", "base"), ("long", "short")))
    text = (f"Fine-tuning at long context changed held-out loss by {_pct(lb)} (95% CI {rel_ci_text(lb)}) and "
            f"fine-tuning on as many tokens at the base's context by {_pct(sb)} ({rel_ci_text(sb)}), so the gain "
            f"attributable to context, long vs short, is {_pct(ls)} ({rel_ci_text(ls)})") + _verdict(ls)
    if seeds is None:
        return text
    rep = seeds.result["replicates"]
    o = rep["overall"]
    return (f"{text} Over {rep['n']} training seeds of both fine-tunes, long vs short is "
            f"{', '.join(_pct(p) for p in rep['pairs'])} seed by seed and {_pct(o)} pooled (95% CI over seeds and "
            f"then windows {rel_ci_text(o)})" + _verdict(o, "these seeds and windows"))


def _bits(x, spec: str = ".4f") -> str:
    """nats -> bits/base, or '-'."""
    return "-" if x is None else format(x / LN2, spec)


def format_context_gain(gain: ContextGain) -> str:
    """The three-way table as fixed-width text (printed by `make demo`)."""
    o = gain.evals["base"].summary["overall"]
    lines = [f"  Is the gain from context, or from more training? held-out loss, {o['n_tokens']:,} tokens in "
             f"{windows_text(gain.evals['base'].summary)} (95% CI: bootstrap over windows)",
             f"  {'model':<33} {'trained (tokens @ context)':>27} {'bits/base':>10} {'95% CI':>18}"]
    for role, name in ROLES.items():
        o = gain.evals[role].summary["overall"]
        ci = f"[{_bits(o['ci_low'])}, {_bits(o['ci_high'])}]"
        t = gain.training.get(role)
        trained = "-" if t is None else f"{t.tokens:,} @ {t.seq_len:,}"
        lines.append(f"  {name:<33} {trained:>27} {_bits(o['mean_nll']):>10} {ci:>18}")
    lines.append(f"  {'paired difference, B - A':<33} {'tokens':>10} {'bits/base':>10} {'95% CI':>20} {'rel %':>7} "
                 f"{'95% CI (%)':>16}")
    for b, a, what in PAIRS:
        d = gain.pairs[b, a].result["overall"]
        ci = f"[{_bits(d['diff_ci_low'], '+.4f')}, {_bits(d['diff_ci_high'], '+.4f')}]"
        rel = "-" if d["rel_change_pct"] is None else f"{d['rel_change_pct']:+.2f}"
        rci = ("-" if d["rel_ci_low"] is None or d["rel_ci_high"] is None
               else f"[{d['rel_ci_low']:+.2f}, {d['rel_ci_high']:+.2f}]")
        lines.append(f"  {f'{b} - {a} ({what})':<33} {d['n_tokens']:>10,} {_bits(d['diff'], '+.4f'):>10} {ci:>20} "
                     f"{rel:>7} {rci:>16}")
    lines += textwrap.wrap(reading(gain), width=110, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)


def _step(d: dict | None) -> str:
    return "" if d is None else \
        f"{_bits(d['mean_delta'], '+.4f')} [{_bits(d['ci_low'], '+.4f')}, {_bits(d['ci_high'], '+.4f')}]"


def change_in_words(lo, hi) -> str:
    """A paired change's CI [lo, hi] (None: none) in words: which way the loss goes, if the CI says."""
    if lo is None or hi is None:
        return "no CI"
    if hi < 0:
        return "falls, CI clear of zero"
    if lo > 0:
        return "rises, CI clear of zero"
    return "CI includes zero"


def format_ablation(gain: ContextGain) -> str | None:
    """The three models' context ablations side by side (printed by `make demo`); None unless all have one."""
    found = {role: gain.evals[role].summary.get("context_ablation") for role in ROLES}
    abl = {role: a for role, a in found.items() if isinstance(a, dict) and "by_length" in a}
    if len(abl) != len(found):
        return None
    first = abl["base"]
    head = (f"Does the model read distant sequence? Context ablation: the same {first['target_tokens']:,} target "
            f"tokens ({first['targets']}, {first['n_windows']} windows) given exactly L preceding tokens; "
            "bits/base and the paired change from the previous L [95% CI]")
    lines = [*textwrap.wrap(head, width=110, initial_indent="  ", subsequent_indent="  "),
             f"  {'L':>7}" + "".join(f" {ROLES[r]:>42}" for r in ROLES)]
    steps = {r: {d["to"]: d for d in a["paired_differences"]} for r, a in abl.items()}
    for j, e in enumerate(first["by_length"]):
        cells = "".join(f" {_bits(abl[r]['by_length'][j]['mean_nll']):>8} {_step(steps[r].get(e['L'])):>33}"
                        for r in ROLES)
        lines.append((f"  {e['L']:>7,}{cells}").rstrip())
    spans = {r: span for r in ROLES if (span := abl[r].get("span"))}
    if len(spans) == len(ROLES):
        s = spans["base"]
        text = f"From L = {s['from']:,} to {s['to']:,}: " + "; ".join(
            f"{ROLES[r]} {_step(d)} bits/base ({change_in_words(d['ci_low'], d['ci_high'])})"
            for r, d in spans.items()) + "."
        lines += textwrap.wrap(text, width=110, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)
