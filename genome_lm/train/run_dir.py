"""The run directory of `genome-lm train`: what rank 0 checks before a run starts (a folder that is
not a run, a used run without --resume, a resume with changed settings), what it records once the
run has started, and what it removes when a new run stops before its first checkpoint.

Run directory `RUN/`: `config.yaml` (resolved), `metrics.jsonl` (one object per optimizer step),
`checkpoints/` (see `checkpoint.py`), `wandb/` (offline by default), `.genome_lm.json` (the marker: the
sequences per step and the sha256 of the shards' manifest.json, which --resume checks).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from genome_lm.config import ExperimentConfig, dump_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.files import sha256_file
from genome_lm.outputs import lock_output, read_marker, what_it_is, write_marker
from genome_lm.train.checkpoint import latest_checkpoint, resume_from
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
    manifest_sha256: str  # of the shards' manifest.json


def _written(run_dir: Path):
    """What a folder holds besides the files a Ray launch makes in it before training starts (`ray/`,
    its workers' message folder `.errors-*`)."""
    return (c for c in run_dir.iterdir() if c.name != "ray" and not c.name.startswith(".errors-"))


def check_run_dir(run_dir: Path, resume: bool, cfg: ExperimentConfig, dp: int) -> RunDir:
    """Rank 0: refuse a folder that is not a run directory, take the resume decision
    (`checkpoint.resume_from`), and refuse a resume with changed settings (`resume.accept_resume`).
    Writes nothing but the removal of half-written checkpoints, and holds the run's lock from here to
    the end of the process (`outputs.lock_output`)."""
    lock_output(run_dir, "train")
    marker = read_marker(run_dir) if run_dir.is_dir() else None
    earlier_run = (run_dir / "config.yaml").is_file() or (run_dir / "checkpoints").is_dir()
    if run_dir.exists() and (not run_dir.is_dir() or any(_written(run_dir))) and (
            (marker is None and not earlier_run) or (marker is not None and marker["kind"] != "run")):
        raise GenomeLMError(f"--out {run_dir} is {what_it_is(run_dir)}, not a run directory; train writes into a new "
                            "folder or its own run directory: choose another --out")
    latest = resume_from(run_dir, resume)
    per_step = cfg.train.micro_batch * cfg.train.grad_accum * dp  # sequences per optimizer step
    accepted = []
    data = manifest_sha256(cfg)
    if resume and latest is not None:  # refuses a changed data/model/optimizer key before anything is written
        accepted = accept_resume(run_dir, cfg, per_step, None if marker is None else marker.get("sequences_per_step"))
        trained_on = None if marker is None else marker.get("shards_manifest_sha256")
        if trained_on is not None and trained_on != data:
            raise GenomeLMError(f"--resume: the shards {cfg.data.shards} are not those {run_dir} was trained on: "
                                f"their manifest.json had sha256 {trained_on}, now {data}; resume on the shards it "
                                "was trained on, or train into a new --out")
    return RunDir(run_dir, latest, accepted, marker is None, run_dir.exists(), per_step, data)


def manifest_sha256(cfg: ExperimentConfig) -> str:
    """sha256 of the shards' manifest.json: what a run records of its data set, to know it by content."""
    return sha256_file(Path(cfg.data.shards) / "manifest.json")


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
        write_marker(rd.path, "run", [cfg.data.shards], sequences_per_step=rd.sequences_per_step,
                     shards_manifest_sha256=rd.manifest_sha256)
    if rd.latest is not None:
        record_resume(rd.path, cfg, rd.accepted)
    else:
        (rd.path / "config.yaml").write_text(dump_experiment(cfg))
