"""The checkpoints of a run (docs/long-runs.md, docs/checkpoints.md): `CheckpointManager` (DCP `async_save` over a
gloo group of its own, as torchtitan does, or `dcp.save`; the newest N kept; loading falls back past a damaged one)
writes `checkpoints/step_N/{model/, train_state/, genome_lm.json}` and the symlink `last`. The run directory
(docs/train.md): what rank 0 checks before a run starts (`check_run_dir`: the resume decision), records once it has
started, and removes when a new run stops before its first checkpoint. `export_checkpoint`: `genome-lm export`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import yaml
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.utils._pytree import tree_leaves

from genome_lm.config import ExperimentConfig, load_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.model import build
from genome_lm.model.weights.layout import TensorSpec, model_tensors
from genome_lm.model.weights.writer import DEFAULT_MAX_SHARD_BYTES, byte_batches, save_pretrained, write_model_dir
from genome_lm.options import read_yaml
from genome_lm.outputs import file_digest, lock_output, make_temp_dir, read_marker, what_it_is, write_marker
from genome_lm.parallel.mesh import ParallelContext
from genome_lm.train.metrics import logged_steps

log = logging.getLogger(__name__)
STEP_RE = re.compile(r"^step_(\d{8})$")


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A training checkpoint (`.../step_N` or `.../last`) -> its `model/`; a model directory as is."""
    p = Path(path)
    if (p / "model" / "config.json").exists():
        return p / "model"
    if (p / "config.json").exists():
        return p
    if (p / "train_state").is_dir():
        raise GenomeLMError(f"{p} has no model/ (the run set train.export_model to false or last); write it with "
                            f"`genome-lm export {p} --out DIR` and use DIR")
    raise GenomeLMError(f"{p} is not a model checkpoint (no config.json, nor model/config.json); "
                        "point to a run's checkpoints/last or a Hugging Face model directory")


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in ckpt_dir.glob("step_*") if (m := STEP_RE.match(p.name)) and p.is_dir())


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    return found[-1][1] if (found := list_checkpoints(ckpt_dir)) else None


def _rng_state() -> dict:
    """CPU generator, and this process's CUDA device's (one state: a run resumes on any number of GPUs)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _rng_like(stored: dict) -> dict:
    """Tensors to load a checkpoint's RNG states (its DCP metadata `stored`) into."""
    rng = {"torch": torch.get_rng_state()}
    if "rng.cuda" in stored:
        rng["cuda"] = torch.empty(tuple(stored["rng.cuda"].size), dtype=torch.uint8)
    return rng


def _restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    cuda = rng.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if cuda.dim() == 2:  # a [devices, N] state: one row per visible device
            cuda = cuda[min(torch.cuda.current_device(), cuda.shape[0] - 1)]
        torch.cuda.set_rng_state(cuda)


def train_state(model, optimizer, scheduler, data, step: int) -> dict:
    with warnings.catch_warnings(action="ignore"):
        optim = get_optimizer_state_dict(model, optimizer)
        weights = get_model_state_dict(model)
    return {
        "model": weights,
        "optimizer": optim,
        "scheduler": scheduler.state_dict(),
        "data": data.state_dict(),
        "rng": _rng_state(),
        "step": step,
    }


def complete_checkpoint(ckpt_dir: Path, tmp: Path, final: Path, step: int, info: dict, keep: int) -> None:
    """Rank 0, once every rank's files are in `tmp`: genome_lm.json, `tmp` -> `final`, `last` switched
    atomically, the newest `keep` kept (and `final`)."""
    (tmp / "genome_lm.json").write_text(json.dumps({"step": step, "time": time.time(), **info}, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    link_tmp = ckpt_dir / f".last.{os.getpid()}"
    link_tmp.unlink(missing_ok=True)
    link_tmp.symlink_to(final.name)
    os.replace(link_tmp, ckpt_dir / "last")
    for _, old in list_checkpoints(ckpt_dir)[:-max(1, keep)]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint step %d -> %s", step, final)


def check_train_state(state_dir: Path) -> dict:
    """The DCP metadata of `state_dir` (key -> what is stored); ValueError when a file of it is missing or short
    (a write cut short): DCP would read it without complaint."""
    metadata = dcp.FileSystemReader(str(state_dir)).read_metadata()
    need: dict[str, int] = {}
    for info in metadata.storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        path = state_dir / name
        have = path.stat().st_size if path.is_file() else None
        if have is None or have < size:
            raise ValueError(f"{name} {'is missing' if have is None else f'has {have:,} bytes'}, its metadata "
                             f"needs {size:,} (a write cut short)")
    return metadata.state_dict_metadata


def load_checkpoint(path: Path, model, optimizer, scheduler, data) -> int:
    """Restore everything `train_state` holds from `path` (saved on any number of processes); its step. Collective."""
    stored = check_train_state(path / "train_state")
    state = train_state(model, optimizer, scheduler, data, 0)
    state["rng"] = _rng_like(stored)
    with warnings.catch_warnings(action="ignore"):
        # partial: parameters that never received a gradient (e.g. upstream's indexer, trained
        # without gradients) have no optimizer state in the checkpoint; the fresh one is unused.
        dcp.load(state, checkpoint_id=str(path / "train_state"), planner=DefaultLoadPlanner(allow_partial_load=True))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    data.load_state_dict(state["data"])
    _restore_rng(state["rng"])
    return int(state["step"])


def free_bytes(path: Path) -> int:
    """Free bytes of the filesystem holding `path` (its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def state_bytes(tree) -> int:
    """Bytes of the tensors in a (nested) state dict as this rank holds them (a DTensor's local shard)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in local)


@dataclass
class _Pending:  # a save whose files a background thread is writing
    tmp: Path
    final: Path
    step: int
    info: dict
    future: Future
    started: float
    finished: float | None = None


class CheckpointManager:
    """The checkpoints of one run in `ckpt_dir`; every method is collective."""

    def __init__(self, ckpt_dir: Path, par: ParallelContext, mode: str = "async", keep: int = 2,
                 on_disk_full: str = "stop", tokenizer_from: str | None = None):
        self.ckpt_dir, self.par, self.keep, self.on_disk_full = ckpt_dir, par, keep, on_disk_full
        self.tokenizer_from = tokenizer_from  # the directory the model was built from (its tokenizer files)
        self.async_ = mode == "async"
        self.pending: _Pending | None = None
        self.staging: Future | None = None  # CUDA: the staged copy's future
        self.pg, self.stager = None, None
        if self.async_:
            if par.sharded and dist.is_initialized():  # collective: every rank creates it
                self.pg = dist.new_group(backend="gloo")
            cuda = par.device.type == "cuda"
            self.stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                       use_async_staging=cuda, use_non_blocking_copy=cuda))

    def load_newest(self, model, optimizer, scheduler, data) -> tuple[int, Path]:
        """(step, path) of the newest checkpoint that loads, warning past those that fail (a truncated or
        missing file); a `GenomeLMError` (it does not fit this config) is raised as it is."""
        found = [path for _, path in reversed(list_checkpoints(self.ckpt_dir))]
        for i, path in enumerate(found):
            try:
                return load_checkpoint(path, model, optimizer, scheduler, data), path
            except GenomeLMError:
                raise
            except (Exception, CheckpointException) as e:  # DCP's (a BaseException), a zip or pickle error
                why = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
                if i + 1 == len(found):
                    raise GenomeLMError(f"--resume: no checkpoint in {self.ckpt_dir} loads; the newest, "
                                        f"{found[0].name}, fails with: {why}; start a new --out") from None
                log.warning("--resume: %s does not load (%s); resuming from the previous checkpoint, %s",
                            path, why, found[i + 1].name)
        raise GenomeLMError(f"--resume: no checkpoint in {self.ckpt_dir}")

    def save(self, step: int, model, optimizer, scheduler, data, info: dict, export_model: bool,
             export_dtype: torch.dtype | None, wait: bool = False) -> dict:
        """Checkpoint `step`; the record's checkpoint fields. `wait`: return once it is complete."""
        t0 = time.perf_counter()
        timings = self.wait()
        state = train_state(model, optimizer, scheduler, data, step)
        if not self._room(step, state, model, export_model, export_dtype):
            return {**timings, "checkpoint_skipped": True}
        final = self.ckpt_dir / f"step_{step:08d}"
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(self.par.on_main(lambda: str(make_temp_dir(self.ckpt_dir, f".{final.name}.partial-"))))
        try:
            if export_model:  # model/, streamed one tensor gathered at a time (collective when sharded)
                save_pretrained(model, tmp / "model", write=self.par.is_main, dtype=export_dtype,
                                tokenizer_from=self.tokenizer_from)
            if self.async_:
                with warnings.catch_warnings(action="ignore"):
                    response = dcp.async_save(state, checkpoint_id=str(tmp / "train_state"), process_group=self.pg,
                                              async_stager=self.stager, no_dist=not dist.is_initialized())
                if isinstance(response, AsyncSaveResponse):
                    self.staging, future = response.staging_completion, response.upload_completion
                else:
                    future = response
                self.pending = pending = _Pending(tmp, final, step, info, future, time.perf_counter())
                future.add_done_callback(lambda _: setattr(pending, "finished", time.perf_counter()))
            else:
                with warnings.catch_warnings(action="ignore"):
                    dcp.save(state, checkpoint_id=str(tmp / "train_state"))
                self.par.barrier()
                if self.par.is_main:
                    complete_checkpoint(self.ckpt_dir, tmp, final, step, info, self.keep)
                self.par.barrier()
                timings.update(checkpoint_write_s=time.perf_counter() - t0, checkpoint_written_step=step)
        except BaseException:
            if self.par.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if wait:
            timings.update(self.wait())
        timings["checkpoint_stall_s"] = time.perf_counter() - t0
        return timings

    def staged(self) -> None:
        """Wait until the save in flight is staged (CUDA: on a side stream): the weights may then change."""
        if self.staging is not None:
            self.staging.result()
            self.staging = None

    def poll(self) -> dict:
        """Complete the save in flight if its files are all written; its timings, else {}."""
        return self.wait() if self.pending is not None and self.pending.future.done() else {}

    def wait(self) -> dict:
        """Block until the save in flight is written, complete it on rank 0; its timings."""
        pending, self.pending = self.pending, None
        if pending is None:
            return {}
        self.staged()
        try:
            pending.future.result()
        except BaseException:
            if self.par.is_main:
                shutil.rmtree(pending.tmp, ignore_errors=True)
            raise
        if self.par.is_main:
            complete_checkpoint(self.ckpt_dir, pending.tmp, pending.final, pending.step, pending.info, self.keep)
        written = (pending.finished or time.perf_counter()) - pending.started
        return {"checkpoint_write_s": written, "checkpoint_written_step": pending.step}

    def _room(self, step: int, state: dict, model, export_model: bool, export_dtype) -> bool:
        """True when checkpoint `step` fits the free space; else one line, then False or GenomeLMError."""
        need = int(self.par.sum_all(state_bytes(state))[0])
        if export_model:  # model/: every parameter and buffer at its global shape, in `export_dtype` (None: as held)
            need += sum(t.numel() * (export_dtype.itemsize if export_dtype is not None and t.is_floating_point()
                                     else t.element_size()) for t in [*model.parameters(), *model.buffers()])

        def check() -> str | None:
            free = free_bytes(self.ckpt_dir)
            if need <= free:
                return None
            newest = latest_checkpoint(self.ckpt_dir)
            kept = (f"the newest complete checkpoint, {newest.name}, is kept and nothing was deleted" if newest
                    else "the run has no checkpoint yet")
            return (f"checkpoint step {step} needs about {need / 1e9:,.3f} GB and {self.ckpt_dir} has "
                    f"{free / 1e9:,.3f} GB free; {kept}. Free space there, or lower train.keep_checkpoints or "
                    "train.export_model")

        problem = self.par.on_main(check)
        if problem is None:
            return True
        if self.on_disk_full == "stop":
            raise GenomeLMError(f"{problem}; stopped (train.on_disk_full: stop): resume with --resume once there "
                                "is room")
        log.warning("%s; this save is skipped and training goes on (train.on_disk_full: skip)", problem)
        return False

    def close(self, finish: bool = True, grace_s: float = 60) -> None:
        """Finish the save in flight, release the stager. A crashed run (not `finish`) completes it only when
        every rank's write ends within `grace_s` (else it stays partial, removed at the next start)."""
        if finish:
            self.wait()
        elif self.pending is not None:
            try:
                self.pending.future.result(timeout=grace_s)
                self.wait()
            except BaseException as e:  # noqa: BLE001 - the write of a crashed run: partial, not an error
                log.warning("checkpoint step %d was not completed (%s); the run resumes from the one before",
                            self.pending.step, type(e).__name__)
                self.pending = None
        if self.stager is not None:
            self.stager.close()
            self.stager = None


# Dotted keys, and whole sections, a resume may change: those that do not change what is computed; the batch
# keys too while the sequences per step stay the same. Any other change is refused: the checkpoint's optimizer
# state was made with the old values.
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
    return {k: v for key, value in tree.items() for k, v in flatten(value, f"{prefix}{key}.").items()}


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
    refused = [c for c in found if not (c[0] in TAKEN or c[0].startswith(TAKEN_SECTIONS)
                                        or (c[0] in BATCH_KEYS and stored_per_step == per_step))]
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
    """What `check_run_dir` found: the run directory to record (`write`) or clean up (`discard_unstarted`)."""

    path: Path
    latest: Path | None  # the checkpoint to resume from (None: a fresh run)
    accepted: list  # the changes a resume takes
    fresh: bool  # no marker yet: the folder is new (or empty), and is marked as a run when it starts
    existed: bool  # the folder was there before this run (empty, when fresh)
    sequences_per_step: int
    manifest_sha256: str  # of the shards' manifest.json

    def discard_unstarted(self) -> None:
        """Remove what a new run that stopped before its first checkpoint wrote (the folder too, if it made it)."""
        if not self.fresh or self.latest is not None or latest_checkpoint(self.path / "checkpoints") is not None:
            return
        if self.existed:
            for child in self.path.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        else:
            shutil.rmtree(self.path, ignore_errors=True)
        log.warning("%s: removed what the run wrote, as it stopped before its first checkpoint (nothing to resume)",
                    self.path)

    def write(self, cfg: ExperimentConfig) -> None:
        """Rank 0, once model, data and any checkpoint have loaded: mark the folder as a run, write config.yaml."""
        self.path.mkdir(parents=True, exist_ok=True)
        if self.fresh:
            write_marker(self.path, "run", [cfg.data.shards], sequences_per_step=self.sequences_per_step,
                         shards_manifest_sha256=self.manifest_sha256)
        path = self.path / "config.yaml"
        if self.accepted:  # a resume that changed anything keeps the earlier config
            n = 1 + sum(1 for _ in self.path.glob("config.resume-*.yaml"))
            path.rename(self.path / f"config.resume-{n}.yaml")
            log.info("--resume takes %s (the earlier config is config.resume-%d.yaml)",
                     ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in self.accepted), n)
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


def check_run_dir(run_dir: Path, resume: bool, cfg: ExperimentConfig, dp: int) -> RunDir:
    """Rank 0: refuse a folder that is not a run directory, or with checkpoints but no --resume; take the resume
    decision (the newest complete checkpoint, half-written ones removed; none: a fresh run, unless metrics.jsonl
    records one); refuse a resume with changed settings. Writes nothing; holds the run's lock to the end."""
    lock_output(run_dir, "train")
    marker = read_marker(run_dir) if run_dir.is_dir() else None
    earlier_run = (run_dir / "config.yaml").is_file() or (run_dir / "checkpoints").is_dir()
    written = run_dir.is_dir() and any(c.name != "ray" and not c.name.startswith(".errors-")
                                       for c in run_dir.iterdir())  # what a Ray launch makes first does not count
    if run_dir.exists() and (not run_dir.is_dir() or written) and (
            (marker is None and not earlier_run) or (marker is not None and marker["kind"] != "run")):
        raise GenomeLMError(f"--out {run_dir} is {what_it_is(run_dir)}, not a run directory; train writes into a new "
                            "folder or its own run directory: choose another --out")
    ckpt_dir, metrics = run_dir / "checkpoints", run_dir / "metrics.jsonl"
    for partial in ckpt_dir.glob(".step_*.partial-*"):  # what a killed run left half-written
        shutil.rmtree(partial, ignore_errors=True)
    latest = latest_checkpoint(ckpt_dir)
    if latest is not None and not resume:
        raise GenomeLMError(f"{run_dir} already has checkpoints (newest {latest.name}); pass --resume to continue "
                            "it, or --out a new run directory")
    if resume and latest is None:
        records = [json.loads(line) for _, line in logged_steps(metrics)[0]] if metrics.is_file() else []
        if saved := [int(r["checkpoint_written_step"]) for r in records if "checkpoint_written_step" in r]:
            raise GenomeLMError(f"--resume: {run_dir} has no checkpoint, but its metrics.jsonl records step "
                                f"{max(saved)}, where the run saved one: its checkpoints were removed, and starting "
                                "over would replace its history. Train into a new --out (or move metrics.jsonl away "
                                "to start this run afresh)")
        earlier = [f for f in ("metrics.jsonl", "config.yaml") if (run_dir / f).is_file()]
        log.warning("--resume: no checkpoint in %s; starting a fresh run from step 0%s", ckpt_dir,
                    f" ({' and '.join(earlier)} of the attempt without a checkpoint start over)" if earlier else "")
    elif resume and latest is not None and not metrics.is_file():
        step = int(latest.name.removeprefix("step_"))
        log.warning("--resume: %s is missing: the records of steps 1-%d are lost; the run continues from %s and "
                    "metrics.jsonl starts again at step %d", metrics, step, latest.name, step + 1)
    per_step = cfg.train.micro_batch * cfg.train.grad_accum * dp  # sequences per optimizer step
    accepted = []
    data = file_digest(Path(cfg.data.shards) / "manifest.json")  # how a run knows its data set
    if resume and latest is not None:  # refuses a changed data/model/optimizer key before anything is written
        accepted = accept_resume(run_dir, cfg, per_step, None if marker is None else marker.get("sequences_per_step"))
        trained_on = None if marker is None else marker.get("shards_manifest_sha256")
        if trained_on is not None and trained_on != data:
            raise GenomeLMError(f"--resume: the shards {cfg.data.shards} are not those {run_dir} was trained on: "
                                f"their manifest.json had sha256 {trained_on}, now {data}; resume on the shards it "
                                "was trained on, or train into a new --out")
    return RunDir(run_dir, latest, accepted, marker is None, run_dir.exists(), per_step, data)


def _dcp_tensors(state_dir: Path, specs: list[TensorSpec], batch_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, tensor)` in the order of `specs` from DCP keys `model.NAME`, `batch_bytes` at a time."""
    for batch in byte_batches(specs, lambda spec: torch.Size(spec[1]).numel() * spec[2].itemsize, batch_bytes):
        state = {"model": {name: torch.empty(shape, dtype=dtype) for name, shape, dtype in batch}}
        with warnings.catch_warnings(action="ignore"):  # "no process group: loading in a single process"
            dcp.load(state, checkpoint_id=str(state_dir))
        loaded = state.pop("model")
        for name, _, _ in batch:
            yield name, loaded.pop(name)


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False,
                      max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """`genome-lm export RUN/checkpoints/step_N --out DIR`: the checkpoint's `model/`, byte for byte, written to `out`
    atomically. One process, no GPU: the model built on meta from `RUN/config.yaml`, tensors read from `train_state/`
    (DCP) `max_shard_bytes` at a time into `save_pretrained`'s writer (memory: about two output files)."""
    ckpt = Path(checkpoint)
    state_dir = ckpt / "train_state"
    if not (state_dir / ".metadata").is_file():
        raise GenomeLMError(f"{ckpt} is not a training checkpoint (no train_state/.metadata); point to "
                            "RUN/checkpoints/step_N or RUN/checkpoints/last")
    config_path = ckpt.resolve().parent.parent / "config.yaml"
    if not config_path.is_file():
        raise GenomeLMError(f"{config_path} not found: export reads the model from the run's config.yaml; keep the "
                            "checkpoint inside its run directory (RUN/checkpoints/step_N)")
    try:
        stored = check_train_state(state_dir)
    except ValueError as e:
        raise GenomeLMError(f"{state_dir} is damaged ({e}); export an earlier checkpoint of the run "
                            f"({ckpt.resolve().parent}/step_N)") from None
    cfg = load_experiment(config_path)
    built = build(cfg.model.name, dtype=cfg.model.dtype, meta=True, **cfg.model.overrides)
    tensors = model_tensors(built.model)
    for name, tensor in tensors.items():
        meta = stored.get(f"model.{name}")
        if meta is None or not hasattr(meta, "size"):
            raise GenomeLMError(f"{state_dir} lacks the weight model.{name} of the model in {config_path}; is it a "
                                "checkpoint of this run?")
        if tuple(meta.size) != tuple(tensor.shape):
            raise GenomeLMError(f"{state_dir}: model.{name} has shape {tuple(meta.size)}, the model in {config_path} "
                                f"has {tuple(tensor.shape)}; is it a checkpoint of this run?")
    # read as stored (a bf16 model's float32 master weights), written in the model's dtype
    specs = [(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
    read = [(name, shape, stored[f"model.{name}"].properties.dtype) for name, shape, _ in specs]
    loaded = ((name, t.to(tensors[name].dtype)) for name, t in _dcp_tensors(state_dir, read, max_shard_bytes))
    try:
        write_model_dir(built.model, out, specs, loaded, overwrite=overwrite, max_shard_bytes=max_shard_bytes,
                        inputs=[ckpt], tokenizer_from=built.source)
    except (RuntimeError, ValueError, CheckpointException) as e:  # a truncated or garbled train_state file
        why = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
        raise GenomeLMError(f"{state_dir} is damaged ({why}); export an earlier checkpoint of the run "
                            f"({ckpt.resolve().parent}/step_N)") from None
    log.info("exported %s (%d tensors) -> %s", ckpt, len(specs), out)
    return Path(out)


def export_command(p) -> str:
    """`genome-lm export`: `p` its ExportParams."""
    return f"export: {export_checkpoint(p.checkpoint, p.out, overwrite=p.overwrite, max_shard_bytes=p.max_shard_size)}"
