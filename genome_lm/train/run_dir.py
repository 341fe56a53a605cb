"""The run directory of `genome-lm train` (docs/train.md): what rank 0 checks before a run starts, records
once it has started, and removes when a new run stops before its first checkpoint. A resume takes the
config keys that do not change what is computed (`TAKEN`), and the batch keys when the sequences per step
stay the same; any other change is refused: the checkpoint's optimizer state was made with the old values."""

from __future__ import annotations

import contextlib
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genome_lm.config import ExperimentConfig, dump_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.options import read_yaml
from genome_lm.outputs import lock_output, read_marker, sha256_file, what_it_is, write_marker
from genome_lm.train.checkpoint import latest_checkpoint, resume_from

log = logging.getLogger(__name__)

# Dotted keys, and whole sections, a resume may change.
TAKEN = (
    "name", "train.steps", "train.checkpoint_every", "train.keep_checkpoints", "train.export_model",
    "train.on_nonfinite", "train.checkpoint_mode", "train.on_disk_full", "train.preempt_signals",
    "parallel.dp", "parallel.cp", "parallel.ep", "parallel.backward_prefetch", "parallel.timeout",
    "parallel.watchdog_factor", "parallel.watchdog_min_s",
)
TAKEN_SECTIONS = ("log.", "memory.")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and tuples stay values."""
    if not isinstance(tree, dict):
        return {prefix.removesuffix("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}."))
    return flat


BATCH_KEYS = ("train.micro_batch", "train.grad_accum")


def accept_resume(run_dir: Path, cfg: ExperimentConfig, per_step: int, stored_per_step: int | None) -> list:
    """The changes [(key, old, new)] from `run_dir/config.yaml` to `cfg`; GenomeLMError on a refused one.
    `per_step` / `stored_per_step`: sequences per step now and when the run started (None: unknown)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise GenomeLMError(f"--resume: {path} is missing; it records the settings {run_dir}'s checkpoints were "
                            "trained with, which --resume compares with the new ones key by key: restore it, or "
                            "train into a new --out")
    try:
        stored = read_yaml(path, "data, model, train, ...")
    except GenomeLMError as e:
        raise GenomeLMError(f"--resume: {e}; it records the settings the run's checkpoints were trained with: "
                            "restore it, or train into a new --out") from None
    with contextlib.suppress(ValueError):  # resolved, unless it no longer validates
        stored = ExperimentConfig.model_validate(stored).model_dump(mode="json")
    old, cur = flatten(stored), flatten(cfg.model_dump(mode="json"))
    found = [(k, old.get(k), cur.get(k)) for k in {**cur, **old} if old.get(k) != cur.get(k)]  # new config's order
    same_batch = stored_per_step is not None and stored_per_step == per_step
    refused = [c for c in found if not (c[0] in TAKEN or c[0].startswith(TAKEN_SECTIONS)
                                        or (c[0] in BATCH_KEYS and same_batch))]
    if any(c[0] in BATCH_KEYS for c in refused) and stored_per_step is not None:
        refused.append(("sequences per step", stored_per_step, per_step))
    if refused:
        listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in refused)
        raise GenomeLMError(
            f"--resume: {run_dir} was trained with other settings ({listed}); its checkpoints' optimizer state, "
            f"schedule and data position belong to {path}: resume with that config (--set only steps, checkpoints, "
            "logging, memory or layout keys), or train into a new --out"
        )
    return found


@dataclass
class RunDir:
    """What `check_run_dir` found, for `write_run_dir`."""

    path: Path
    latest: Path | None  # the checkpoint to resume from (None: a fresh run)
    accepted: list  # the changes a resume takes
    fresh: bool  # no marker yet: the folder is new (or empty), and is marked as a run when it starts
    existed: bool  # the folder was there before this run (empty, when fresh)
    sequences_per_step: int
    manifest_sha256: str  # of the shards' manifest.json


def check_run_dir(run_dir: Path, resume: bool, cfg: ExperimentConfig, dp: int) -> RunDir:
    """Rank 0: refuse a folder that is not a run directory, take the resume decision, and refuse a resume
    with changed settings. Writes nothing; holds the run's lock to the end of the process."""
    lock_output(run_dir, "train")
    marker = read_marker(run_dir) if run_dir.is_dir() else None
    earlier_run = (run_dir / "config.yaml").is_file() or (run_dir / "checkpoints").is_dir()
    written = run_dir.is_dir() and any(c.name != "ray" and not c.name.startswith(".errors-")
                                       for c in run_dir.iterdir())  # what a Ray launch makes first does not count
    if run_dir.exists() and (not run_dir.is_dir() or written) and (
            (marker is None and not earlier_run) or (marker is not None and marker["kind"] != "run")):
        raise GenomeLMError(f"--out {run_dir} is {what_it_is(run_dir)}, not a run directory; train writes into a new "
                            "folder or its own run directory: choose another --out")
    latest = resume_from(run_dir, resume)
    per_step = cfg.train.micro_batch * cfg.train.grad_accum * dp  # sequences per optimizer step
    accepted = []
    data = sha256_file(Path(cfg.data.shards) / "manifest.json")  # how a run knows its data set
    if resume and latest is not None:  # refuses a changed data/model/optimizer key before anything is written
        accepted = accept_resume(run_dir, cfg, per_step, None if marker is None else marker.get("sequences_per_step"))
        trained_on = None if marker is None else marker.get("shards_manifest_sha256")
        if trained_on is not None and trained_on != data:
            raise GenomeLMError(f"--resume: the shards {cfg.data.shards} are not those {run_dir} was trained on: "
                                f"their manifest.json had sha256 {trained_on}, now {data}; resume on the shards it "
                                "was trained on, or train into a new --out")
    return RunDir(run_dir, latest, accepted, marker is None, run_dir.exists(), per_step, data)


def discard_unstarted(rd: RunDir) -> None:
    """Remove what a new run that stopped before its first checkpoint wrote (the folder too, if it made it)."""
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
    """Rank 0, once model, data and any checkpoint have loaded: mark the folder as a run, write config.yaml."""
    rd.path.mkdir(parents=True, exist_ok=True)
    if rd.fresh:
        write_marker(rd.path, "run", [cfg.data.shards], sequences_per_step=rd.sequences_per_step,
                     shards_manifest_sha256=rd.manifest_sha256)
    path = rd.path / "config.yaml"
    if rd.accepted:  # a resume that changed anything keeps the earlier config
        n = 1 + sum(1 for _ in rd.path.glob("config.resume-*.yaml"))
        path.rename(rd.path / f"config.resume-{n}.yaml")
        log.info("--resume takes %s (the earlier config is config.resume-%d.yaml)",
                 ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in rd.accepted), n)
    path.write_text(dump_experiment(cfg))
