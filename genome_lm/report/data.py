"""What a report is built from: eval directories, compare directories and training runs."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.eval.compare import COMPARE_FILE, compare_evals, load_compare
from genome_lm.eval.outputs import SUMMARY_FILE, load_summary

METRIC_COLUMNS = ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "peak_mem_bytes", "seq_tokens")


@dataclass
class EvalResult:
    label: str
    dir: Path
    summary: dict


@dataclass
class CompareResult:
    label: str
    result: dict


@dataclass
class RunMetrics:
    label: str
    columns: dict[str, np.ndarray]  # name -> float64 [S] (NaN where missing)


def windows_text(summary: dict) -> str:
    """How many windows an eval scored, and which of its split (`eval --window-pick`)."""
    shards = summary.get("shards", {})
    n, m = shards.get("n_windows", "?"), shards.get("n_windows_in_split")
    if m is None or n == m:
        return f"{n} windows"
    which = "spread evenly over it" if shards.get("window_pick", "first") == "spread" else f"its first {n}"
    return f"{n} of the split's {m} windows ({which})"


def load_eval(eval_dir: str | Path, label: str | None = None) -> EvalResult:
    d = Path(eval_dir)
    if not d.is_dir():
        raise GenomeLMError(f"{d} does not exist; give the --out directory of `genome-lm eval`")
    return EvalResult(label or d.name, d, load_summary(d))


def load_compare_dir(compare_dir: str | Path, label: str | None = None) -> CompareResult:
    d = Path(compare_dir)
    result = load_compare(d)
    return CompareResult(label or f"{_side(result['b'])} vs {_side(result['a'])}", result)


def _side(side: dict) -> str:
    """A compare side's name: its eval directory's, or with replicates the first one's and how many."""
    dirs = side.get("dirs") or [side["dir"]]
    return Path(dirs[0]).name + (f" (+{len(dirs) - 1} replicates)" if len(dirs) > 1 else "")


def load_dirs(dirs: Iterable[str | Path]) -> tuple[list[EvalResult], list[CompareResult], list[EvalResult]]:
    """Sort report inputs into evals (summary.json), comparisons (compare.json) and variants outputs."""
    evals, compares, variants = [], [], []
    for d in map(Path, dirs):
        try:
            summary = json.loads((d / SUMMARY_FILE).read_text())
        except (OSError, ValueError):
            summary = None
        command = summary.get("command") if isinstance(summary, dict) else None
        if command == "score":
            raise GenomeLMError(f"{d} is a `genome-lm score` output (per-base log-probs); the report reads the "
                                "--out of `genome-lm eval`, `compare` and `variants`")
        if command == "variants":
            if missing := [k for k in ("contexts", "variants", "metrics") if k not in summary]:
                raise GenomeLMError(f"{d / SUMMARY_FILE} is not a variants summary (it has no {', '.join(missing)}); "
                                    "rebuild it with `genome-lm variants` and --overwrite")
            variants.append(EvalResult(d.name, d, summary))
        elif (d / SUMMARY_FILE).is_file():
            evals.append(load_eval(d))
        elif (d / COMPARE_FILE).is_file():
            compares.append(load_compare_dir(d))
        elif not d.exists():
            raise GenomeLMError(f"{d} does not exist; give eval or compare output directories")
        else:
            run = " (a training run's metrics go in with --run)" if (d / "metrics.jsonl").is_file() else ""
            raise GenomeLMError(f"{d} holds neither {SUMMARY_FILE} nor {COMPARE_FILE}; give the --out of "
                                f"`genome-lm eval` or `genome-lm compare`{run}")
    return evals, compares, variants


def implied_compares(evals: list[EvalResult]) -> list[CompareResult]:
    """Every later eval against the first (the baseline), where they scored the same windows."""
    import logging

    out = []
    for ev in evals[1:]:
        try:
            result = compare_evals(evals[0].dir, ev.dir)
        except GenomeLMError as e:
            logging.getLogger(__name__).warning("no relative change for %s vs %s: %s", ev.label, evals[0].label, e)
            continue
        out.append(CompareResult(f"{ev.label} vs {evals[0].label}", result))
    return out


def load_run(run_dir: str | Path, label: str | None = None) -> RunMetrics:
    """Columns of RUN/metrics.jsonl (one JSON object per logged step)."""
    d = Path(run_dir)
    path = d / "metrics.jsonl"
    if not path.is_file():
        raise GenomeLMError(f"{d} has no metrics.jsonl; give the run directory of `genome-lm train` (--out)")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise GenomeLMError(f"{path}:{n}: not a JSON object; is the file damaged?") from None
    cols = {c: np.array([np.nan if r.get(c) is None else r[c] for r in rows], dtype=np.float64)
            for c in METRIC_COLUMNS}
    return RunMetrics(label or d.name, cols)
