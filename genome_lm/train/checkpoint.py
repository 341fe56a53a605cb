"""Training checkpoints: the whole training state through DCP, the weights also as a Hugging
Face-style directory.

    RUN/checkpoints/
      step_00000100/
        model/          config.json + model.safetensors (or model-0000k-of-0000n.safetensors + index
                        past 5 GiB): what transformers and `genome-lm eval` load; only with
                        train.export_model (true: every checkpoint, last: the final one)
        train_state/    torch.distributed.checkpoint: model, optimizer, scheduler, data position, RNG
        genome_lm.json  step, loss, time, layout, model_exported
      last -> step_00000100

A checkpoint is written under a hidden temporary name and renamed when complete, then `last`
is switched atomically; only complete checkpoints ever carry a `step_*` name. The newest
`keep` checkpoints are kept. `train_state/` alone resumes a run; `genome-lm export` writes the
`model/` of a checkpoint that has none (`genome_lm.train.export`).

Distributed runs: every rank writes its shards into `train_state/` (DCP, global shapes: a run
resumes on any number of processes) and gathers `model/` one tensor at a time for rank 0 to
stream (docs/parallel.md, checkpoints). `model.init` reads a checkpoint's `model/`
(`resolve_model_dir`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from genome_lm.errors import GenomeLMError
from genome_lm.files import make_temp_dir
from genome_lm.parallel.mesh import ParallelContext

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
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_RE.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1][1] if found else None


def _rng_state() -> dict:
    """CPU generator, and this process's CUDA device's (one state, whatever the number of visible
    devices, so a run resumes on a machine with another number of GPUs)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _rng_like(stored: dict) -> dict:
    """Tensors to load the RNG states of a checkpoint (its DCP metadata `stored`) into, the CUDA
    one in the shape it was saved in."""
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


def partial_dir(ckpt_dir: Path, step: int, par: ParallelContext) -> tuple[Path, Path]:
    """(temporary folder, final name) of checkpoint `step`: rank 0 makes the hidden temporary folder
    and every rank gets its name (collective in a distributed run)."""
    final = ckpt_dir / f"step_{step:08d}"

    def make_tmp() -> str:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        return str(make_temp_dir(ckpt_dir, f".{final.name}.partial-"))

    return Path(par.on_main(make_tmp)), final


def complete_checkpoint(ckpt_dir: Path, tmp: Path, final: Path, step: int, info: dict, keep: int) -> Path:
    """Rank 0, once every rank's files are in `tmp`: write genome_lm.json, rename `tmp` to `final`,
    switch `last` to it atomically, then remove all but the newest `keep` complete checkpoints (never
    the one just completed)."""
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
    return final


def save_checkpoint(ckpt_dir: Path, step: int, model, optimizer, scheduler, data, info: dict, keep: int,
                    parallel: ParallelContext | None = None, export_model: bool = True,
                    export_dtype: torch.dtype | None = None, tokenizer_from: str | None = None) -> Path:
    """Write checkpoint `step` synchronously (collective in a distributed run: every rank calls it);
    `model/` only with `export_model` (files of at most 5 GiB), its weights in `export_dtype` (the
    model's dtype when training keeps float32 master weights; None: as held). The asynchronous
    writer is `genome_lm.train.saver.Checkpointer`."""
    par = parallel or ParallelContext()
    tmp, final = partial_dir(ckpt_dir, step, par)
    try:
        write_model_dir(tmp, model, par, export_model, export_dtype, tokenizer_from)
        with warnings.catch_warnings(action="ignore"):
            dcp.save(train_state(model, optimizer, scheduler, data, step), checkpoint_id=str(tmp / "train_state"))
        par.barrier()
        if par.is_main:
            complete_checkpoint(ckpt_dir, tmp, final, step, info, keep)
    except BaseException:
        if par.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    par.barrier()
    return final


def write_model_dir(tmp: Path, model, par: ParallelContext, export_model: bool, export_dtype,
                    tokenizer_from: str | None = None) -> None:
    """The checkpoint's `model/`, streamed one tensor gathered at a time (collective when sharded),
    with the tokenizer files of `tokenizer_from` (the directory the model was built from)."""
    from genome_lm.model.weights.writer import save_pretrained

    if export_model:
        save_pretrained(model, tmp / "model", write=par.is_main, dtype=export_dtype, tokenizer_from=tokenizer_from)


def stored_state(state_dir: Path) -> dict:
    """The DCP metadata of `state_dir` (`train_state/`): key -> what is stored."""
    return dcp.FileSystemReader(str(state_dir)).read_metadata().state_dict_metadata


class DamagedCheckpoint(Exception):
    """A `train_state/` whose files are shorter than its metadata says (a write cut short)."""


def check_train_state(state_dir: Path) -> None:
    """Raise `DamagedCheckpoint` when a file of `state_dir` is missing or ends before the bytes its
    metadata places in it: DCP reads such a file without complaint and hands back short tensors."""
    need: dict[str, int] = {}
    for info in dcp.FileSystemReader(str(state_dir)).read_metadata().storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        path = state_dir / name
        have = path.stat().st_size if path.is_file() else None
        if have is None or have < size:
            raise DamagedCheckpoint(f"{name} {'is missing' if have is None else f'has {have:,} bytes'}, its metadata "
                                    f"needs {size:,} (a write cut short)")


def load_checkpoint(path: Path, model, optimizer, scheduler, data) -> int:
    """Restore weights, optimizer, scheduler, data position and RNG from `path`; return its step.
    Collective in a distributed run; the checkpoint may come from any number of processes."""
    check_train_state(path / "train_state")
    state = train_state(model, optimizer, scheduler, data, 0)
    state["rng"] = _rng_like(stored_state(path / "train_state"))
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


def load_newest_whole(ckpt_dir: Path, model, optimizer, scheduler, data) -> tuple[int, Path]:
    """`load_checkpoint` from the newest checkpoint of `ckpt_dir` that loads: one that fails (a
    truncated or missing file) is named in a warning and the previous one is tried. Returns (step,
    path). A `GenomeLMError` (the checkpoint does not fit this config) is raised as it is; when no
    checkpoint loads, one `GenomeLMError` names the newest and why."""
    found = [path for _, path in reversed(list_checkpoints(ckpt_dir))]
    for i, path in enumerate(found):
        try:
            return load_checkpoint(path, model, optimizer, scheduler, data), path
        except GenomeLMError:
            raise
        except (Exception, CheckpointException) as e:  # DCP's (a BaseException), a zip or pickle error
            why = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
            if i + 1 == len(found):
                raise GenomeLMError(f"--resume: no checkpoint in {ckpt_dir} loads; the newest, {found[0].name}, fails "
                                    f"with: {why}; start a new --out") from None
            log.warning("--resume: %s does not load (%s); resuming from the previous checkpoint, %s",
                        path, why, found[i + 1].name)
    raise GenomeLMError(f"--resume: no checkpoint in {ckpt_dir}")


def clean_partials(ckpt_dir: Path) -> None:
    """Remove checkpoints a killed run left half-written (hidden `.step_*.partial-*` dirs)."""
    if ckpt_dir.is_dir():
        for p in ckpt_dir.glob(".step_*.partial-*"):
            shutil.rmtree(p, ignore_errors=True)
