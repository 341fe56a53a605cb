"""Writing the training checkpoints of a run: asynchronous by default, checked against free space.

    ckpt = Checkpointer(run_dir / "checkpoints", par, mode="async", keep=2, on_disk_full="stop")
    timings = ckpt.save(step, model, optimizer, scheduler, stream, info, export, export_dtype)
    ckpt.staged()        # before the next optimizer step: the staged copy is complete
    timings = ckpt.poll()  # at each step: finishes a save whose files are all written
    ckpt.close()

`mode: async` uses torch's `torch.distributed.checkpoint.async_save`: the state is copied to host
memory (pinned on CUDA, staged on a side stream) and written by a background thread over a gloo
group of its own (the training collectives keep the default group), as torchtitan does. Training
waits only while the state is copied (and for the previous save, when it has not finished by the
next one). Rank 0 completes a checkpoint (genome_lm.json, rename, `last`, `keep`) once its write
has finished: DCP's coordinator writes the metadata after every rank's files, so no collective is
needed. `mode: sync` writes with `dcp.save` and waits. `model/` (train.export_model) is always
written synchronously, streamed one tensor at a time.

What it reports into the step's metrics record: `checkpoint_stall_s` (what training waited at this
save), and, when a background write completes, `checkpoint_write_s` and `checkpoint_written_step`.

Before each save the checkpoint's size (the bytes of the state every rank holds, plus `model/`) is
compared with the free space of the checkpoint folder (`free_bytes`). When it does not fit, one line
says so and `train.on_disk_full` decides: `skip` this save and train on, or `stop` the run (a
GenomeLMError); nothing is deleted either way.
"""

from __future__ import annotations

import logging
import shutil
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from genome_lm.errors import GenomeLMError
from genome_lm.parallel.mesh import ParallelContext
from genome_lm.train.checkpoint import (
    complete_checkpoint,
    latest_checkpoint,
    partial_dir,
    train_state,
    write_model_dir,
)

log = logging.getLogger(__name__)


def free_bytes(path: Path) -> int:
    """Free bytes of the filesystem holding `path` (its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def state_bytes(tree) -> int:
    """Bytes of the tensors in a (nested) state dict as this rank holds them (a DTensor's local shard)."""
    if isinstance(tree, dict):
        return sum(state_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(state_bytes(v) for v in tree)
    if isinstance(tree, torch.Tensor):
        local = tree.to_local() if hasattr(tree, "to_local") else tree
        return local.numel() * local.element_size()
    return 0


def export_bytes(model, dtype: torch.dtype | None) -> int:
    """Bytes of the model's weights in `model/`: every parameter and buffer at its global shape, in
    `dtype` (None: as held)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * (t.element_size() if dtype is None or not t.is_floating_point()
                            else torch.tensor([], dtype=dtype).element_size()) for t in tensors)


@dataclass
class _Pending:
    """A save whose files a background thread is writing."""

    tmp: Path
    final: Path
    step: int
    info: dict
    future: Future
    started: float
    finished: float | None = None


class Checkpointer:
    def __init__(self, ckpt_dir: Path, par: ParallelContext, mode: str = "async", keep: int = 2,
                 on_disk_full: str = "stop", tokenizer_from: str | None = None):
        self.ckpt_dir, self.par, self.keep, self.on_disk_full = ckpt_dir, par, keep, on_disk_full
        self.tokenizer_from = tokenizer_from  # the directory the model was built from (its tokenizer files)
        self.async_ = mode == "async"
        self.pending: _Pending | None = None
        self.staging: Future | None = None  # CUDA: the staged copy's future
        self.pg, self.stager = None, None
        if self.async_:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            if par.sharded and dist.is_initialized():  # collective: every rank creates it
                self.pg = dist.new_group(backend="gloo")
            cuda = par.device.type == "cuda"
            self.stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                       use_async_staging=cuda, use_non_blocking_copy=cuda))

    def save(self, step: int, model, optimizer, scheduler, data, info: dict, export_model: bool,
             export_dtype: torch.dtype | None, wait: bool = False) -> dict:
        """Checkpoint `step` (collective). Returns the record's checkpoint fields; `wait`: return only
        once it is complete (the last step, a preemption)."""
        t0 = time.perf_counter()
        timings = self.wait()
        state = train_state(model, optimizer, scheduler, data, step)
        if not self._room(step, state, model, export_model, export_dtype):
            return {**timings, "checkpoint_skipped": True}
        tmp, final = partial_dir(self.ckpt_dir, step, self.par)
        try:
            write_model_dir(tmp, model, self.par, export_model, export_dtype, self.tokenizer_from)
            if self.async_:
                self._start(state, tmp, final, step, info)
            else:
                with warnings.catch_warnings(action="ignore"):
                    dcp.save(state, checkpoint_id=str(tmp / "train_state"))
                self.par.barrier()
                if self.par.is_main:
                    complete_checkpoint(self.ckpt_dir, tmp, final, step, info, self.keep)
                self.par.barrier()
        except BaseException:
            if self.par.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        timings["checkpoint_stall_s"] = time.perf_counter() - t0
        if wait:
            self.staged()
            timings.update(self.wait())
            timings["checkpoint_stall_s"] = time.perf_counter() - t0
        return timings

    def _start(self, state: dict, tmp: Path, final: Path, step: int, info: dict) -> None:
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        with warnings.catch_warnings(action="ignore"):
            response = dcp.async_save(state, checkpoint_id=str(tmp / "train_state"), process_group=self.pg,
                                      async_stager=self.stager, no_dist=not dist.is_initialized())
        if isinstance(response, AsyncSaveResponse):
            self.staging, future = response.staging_completion, response.upload_completion
        else:
            future = response
        pending = _Pending(tmp, final, step, info, future, time.perf_counter())
        future.add_done_callback(lambda _: setattr(pending, "finished", time.perf_counter()))
        self.pending = pending

    def staged(self) -> None:
        """Wait until the state of the save in flight is copied (CUDA stages on a side stream): the
        optimizer may then change the weights."""
        if self.staging is not None:
            self.staging.result()
            self.staging = None

    def poll(self) -> dict:
        """Complete the save in flight if its files are all written; its timings, else {}."""
        if self.pending is None or not self.pending.future.done():
            return {}
        return self.wait()

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
        """True when checkpoint `step` fits the free space; otherwise one line, then `skip` (False)
        or `stop` (GenomeLMError). Collective (the ranks' state bytes are summed)."""
        need = int(self.par.sum_all(state_bytes(state))[0])
        if export_model:
            need += export_bytes(model, export_dtype)

        def check() -> str | None:
            free = free_bytes(self.ckpt_dir)
            if need <= free:
                return None
            newest = latest_checkpoint(self.ckpt_dir)
            kept = f"the newest complete checkpoint, {newest.name}, is kept" if newest else "no checkpoint yet"
            return (f"checkpoint step {step} needs about {need / 1e9:,.3f} GB and {self.ckpt_dir} has "
                    f"{free / 1e9:,.3f} GB free; {kept} and nothing was deleted. Free space there, or lower "
                    "train.keep_checkpoints or train.export_model")

        problem = self.par.on_main(check)
        if problem is None:
            return True
        if self.on_disk_full == "stop":
            raise GenomeLMError(f"{problem}; stopped (train.on_disk_full: stop): resume with --resume once there "
                                "is room")
        log.warning("%s; this save is skipped and training goes on (train.on_disk_full: skip)", problem)
        return False

    def close(self, finish: bool = True, grace_s: float = 60) -> dict:
        """Finish the save in flight and release the stager. A crashed run (`finish` False) completes it
        only when its write ends within `grace_s` (every rank's files written: a rank that died
        mid-write fails it), else leaves it partial, to be removed at the next start."""
        timings = {}
        if finish:
            timings = self.wait()
        elif self.pending is not None:
            try:
                self.pending.future.result(timeout=grace_s)
                timings = self.wait()
            except BaseException as e:  # noqa: BLE001 - the write of a crashed run: partial, not an error
                log.warning("checkpoint step %d was not completed (%s); the run resumes from the one before",
                            self.pending.step, type(e).__name__)
                self.pending = None
        if self.stager is not None:
            self.stager.close()
            self.stager = None
        return timings
