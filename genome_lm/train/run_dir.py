"""The run directory of `genome-lm train`: what rank 0 checks before a run starts (a folder that is
not a run, a used run without --resume, a resume with changed settings), what it records once the
run has started, and what it removes when a new run stops before its first checkpoint.

Run directory `RUN/`: `config.yaml` (resolved), `metrics.jsonl` (one object per optimizer step),
`checkpoints/` (see `checkpoint.py`), `wandb/` (offline by default), `.genome_lm.json` (the marker).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from genome_lm.config import ExperimentConfig, dump_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.options import read_yaml
from genome_lm.outputs import lock_output, read_marker, what_it_is, write_marker
from genome_lm.train.checkpoint import clean_partials, latest_checkpoint
from genome_lm.train.metrics import logged_steps
from genome_lm.train.resume import accept_resume, record_resume

log = logging.getLogger(__name__)


@dataclass
class RunDir:
    """What `check_run_dir` found: the checkpoint to resume from (None: a fresh run) and the changes a
    resume takes; `write_run_dir` records them once the run has started."""

    path: Path
    latest: Path | None
    accepted: list
    fresh: bool  # no marker yet: the folder is new (or empty), and is marked as a run when it starts
    existed: bool  # the folder was there before this run (empty, when fresh)
    sequences_per_step: int


def _written(run_dir: Path):
    """What a folder holds besides the files a Ray launch makes in it before training starts (`ray/`,
    its workers' message folder `.errors-*`)."""
    return (c for c in run_dir.iterdir() if c.name != "ray" and not c.name.startswith(".errors-"))


def check_run_dir(run_dir: Path, resume: bool, cfg: ExperimentConfig, dp: int) -> RunDir:
    """Rank 0: refuse a folder that is not a run directory, clear half-written checkpoints, refuse a
    used run directory without --resume and a resume with changed settings (`resume.accept_resume`).
    Writes nothing but the removal of half-written checkpoints, and holds the run's lock from here to the
    end of the process (`outputs.lock_output`)."""
    lock_output(run_dir, "train")
    marker = read_marker(run_dir) if run_dir.is_dir() else None
    earlier_run = (run_dir / "config.yaml").is_file() or (run_dir / "checkpoints").is_dir()
    if run_dir.exists() and (not run_dir.is_dir() or any(_written(run_dir))) and (
            (marker is None and not earlier_run) or (marker is not None and marker["kind"] != "run")):
        raise GenomeLMError(f"--out {run_dir} is {what_it_is(run_dir)}, not a run directory; train writes into a new "
                            "folder or its own run directory: choose another --out")
    ckpt_dir = run_dir / "checkpoints"
    clean_partials(ckpt_dir)
    latest = latest_checkpoint(ckpt_dir)
    if latest is not None and not resume:
        raise GenomeLMError(f"{run_dir} already has checkpoints (newest {latest.name}); pass --resume to continue "
                            "it, or --out a new run directory")
    if resume and latest is None:
        check_never_checkpointed(run_dir)
        earlier = [f for f in ("metrics.jsonl", "config.yaml") if (run_dir / f).is_file()]
        log.warning("--resume: no checkpoint in %s; starting a fresh run from step 0%s", ckpt_dir,
                    f" ({' and '.join(earlier)} of the attempt without a checkpoint start over)" if earlier else "")
    per_step = cfg.train.micro_batch * cfg.train.grad_accum * dp  # sequences per optimizer step
    accepted = []
    if resume and latest is not None:  # refuses a changed data/model/optimizer key before anything is written
        accepted = accept_resume(run_dir, cfg, per_step, None if marker is None else marker.get("sequences_per_step"))
    return RunDir(run_dir, latest if resume else None, accepted, marker is None, run_dir.exists(), per_step)


def check_never_checkpointed(run_dir: Path) -> None:
    """A `--resume` that finds no checkpoint starts afresh only when the run never wrote one (an attempt
    stopped before its first): when metrics.jsonl records a step at which config.yaml's run saved one
    (a multiple of checkpoint_every, or its last step), its checkpoints were removed, and starting over
    would replace its history. Refused in one line."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return
    steps = [step for step, _ in logged_steps(path)[0]]
    try:
        train_cfg = read_yaml(run_dir / "config.yaml", "data, model, train, ...").get("train") or {}
        every, last = int(train_cfg.get("checkpoint_every", 0)), int(train_cfg.get("steps", 0))
    except (GenomeLMError, ValueError, TypeError, AttributeError):
        every, last = 1, 0  # no readable config: any logged step counts
    saved = [s for s in steps if (every and s % every == 0) or s == last]
    if saved:
        raise GenomeLMError(f"--resume: {run_dir} has no checkpoint, but its metrics.jsonl records step {max(saved)}, "
                            "where the run saved one: its checkpoints were removed, and starting over would replace "
                            "its history. Train into a new --out (or move metrics.jsonl away to start this run afresh)")


def discard_unstarted(rd: RunDir) -> None:
    """A new run that stopped before its first checkpoint holds nothing to resume: remove what it
    wrote (the folder too, unless it existed before, empty), saying so."""
    if not rd.fresh or rd.latest is not None or latest_checkpoint(rd.path / "checkpoints") is not None:
        return
    if rd.existed:
        for child in rd.path.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    else:
        shutil.rmtree(rd.path, ignore_errors=True)
    log.warning("%s: removed what the run wrote, as it stopped before its first checkpoint (nothing to resume)",
                rd.path)


def write_run_dir(rd: RunDir, cfg: ExperimentConfig) -> None:
    """Rank 0, once the model, the data and any checkpoint have loaded: mark the folder as a run and
    write config.yaml (a resume: `resume.record_resume`)."""
    rd.path.mkdir(parents=True, exist_ok=True)
    if rd.fresh:
        write_marker(rd.path, "run", [cfg.data.shards], sequences_per_step=rd.sequences_per_step)
    if rd.latest is not None:
        record_resume(rd.path, cfg, rd.accepted)
    else:
        (rd.path / "config.yaml").write_text(dump_experiment(cfg))
