"""Eval and score over several processes (docs/parallel.md, Distributed eval): the launch, and what differs
from one process in the `evaluate` / `score` every rank runs: the dp x cp layout, the FSDP2 model, the
scoring rounds, the gather on rank 0."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from genome_lm.errors import GenomeLMError
from genome_lm.outputs import holding
from genome_lm.parallel.mesh import resolve_layout

IDLE_TOKENS_PER_RANK = 8  # tokens per CP rank of an idle forward

EVAL_WORDS = dict(  # dp is always processes / cp
    too_few="--cp {cp} splits each window (region) over {cp} processes, this launch has {world}; {nproc} {cp} "
            "(or a multiple of {cp}), or lower --cp",
    not_divisor="--cp {cp} does not divide the {world} processes of this launch (dp = processes / cp); use --nproc "
                "{lower} or {upper}, or a --cp that divides {world}",
)


def layout(cp: int, world: int) -> tuple[int, int]:
    """(dp, cp) of an eval with `--cp cp` on `world` processes; a one-line error naming the fix."""
    return resolve_layout(cp, "auto", world, EVAL_WORDS)


def world_size() -> int:
    """Processes of this launch: the initialised process group's, else the launcher's WORLD_SIZE, else 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def check(cfg, world: int) -> tuple[int, int]:
    """What an eval on `world` processes needs of `cfg` (before anything starts); returns (dp, cp)."""
    dp, cp = layout(cfg.cp, world)
    if world > 1:
        check_engine(cfg)
    return dp, cp


def check_engine(cfg) -> None:
    if cfg.engine != "parallel" or cfg.parity:
        raise GenomeLMError("--engine streaming and --parity run on one process (the streaming engine walks the "
                            "whole model on one device); leave out --nproc / --ray, or score with --engine parallel "
                            "and no --parity")


def device_for(cfg, device, world: int) -> torch.device | None:
    """The device of this process: `device` (Ray gives one), `cfg.device`, or None for
    `mesh.default_device`; a plain 'cuda' on several processes means each its own GPU."""
    if device is not None:
        return torch.device(device)
    if cfg.device is None:
        return None
    dev = torch.device(cfg.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise GenomeLMError(f"--device {cfg.device}: this machine has no CUDA GPU that torch can use "
                            f"(torch {torch.__version__}); leave out --device to score on the CPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise GenomeLMError(f"--device {cfg.device}: this machine has {torch.cuda.device_count()} GPU(s), "
                            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return None if world > 1 and dev.type == "cuda" and dev.index is None else dev


def n_pieces(length: int, seq_len: int) -> int:
    return max(1, -(-int(length) // seq_len))


def check_pieces(lengths: np.ndarray, seq_len: int, cp: int) -> None:
    """Every piece must have at least `cp` tokens to be split over the CP group."""
    last = lengths - (np.maximum(1, -(-lengths // seq_len)) - 1) * seq_len  # [W] tokens of each window's last piece
    short = int(np.argmin(last))
    if last[short] < cp:
        raise GenomeLMError(f"--cp {cp}: window {short} ends in a piece of {int(last[short])} token(s), fewer than the "
                            f"{cp} CP ranks it is split over; choose a --seq-len that leaves longer last pieces, "
                            "or a smaller --cp")


def build_model(cfg, model_dir: str, par):
    """The causal LM ready to score (`parallelize`); distributed: built on meta, then each rank reads its rows."""
    from genome_lm.config import BlockSizes, MemoryConfig
    from genome_lm.model import build
    from genome_lm.model.weights.reader import load_weights_
    from genome_lm.train.parallelize import parallelize

    # training's block sizes unless the eval sets them (EvalConfig inherits config.BlockSizes); MoE blocks
    # are rebuilt in backward only, so moe_recompute changes nothing without autograd
    memory = MemoryConfig(**cfg.model_dump(include=set(BlockSizes.model_fields)), moe_recompute=True)
    if not par.distributed:
        return parallelize(build(model_dir, dtype=cfg.dtype, device=par.device).model, memory, par)
    built = build(model_dir, dtype=cfg.dtype, meta=True)
    parallelize(built.model, memory, par)  # in place
    load_weights_(built.model, model_dir, par.device, dtype=built.dtype)
    return built.model


def on_ranks(cfg, command: str, device, run: Callable[[Any, Any], dict]) -> dict:
    """`run(cfg, par)` on this process (`init_parallel`: one rank of a launch laid out by `layout`, or the only
    one), with `cfg.dtype` resolved (`resolve_dtype`); rank 0 holds --out's lock (outputs.py) from its
    checks to its last write."""
    from genome_lm.config import ParallelConfig
    from genome_lm.eval.config import resolve_dtype
    from genome_lm.parallel.mesh import init_parallel

    world = world_size()
    layout(cfg.cp, world)
    par = init_parallel(ParallelConfig(cp=cfg.cp), device_for(cfg, device, world))
    try:
        with holding(cfg.out, command) if par.is_main and cfg.out else contextlib.nullcontext():
            return run(cfg.model_copy(update={"dtype": resolve_dtype(cfg.dtype, par.device)}), par)
    finally:
        par.shutdown()


def launch(cfg, command: str, fn: Callable, check_inputs: Callable, keeps: Callable[[Path], str],
           nproc: int | None, ray: str | None | bool = None, max_restarts: int = 0) -> None:
    """Run `fn(cfg as JSON)` (module level: the launchers pickle it) on `nproc` local processes, or under Ray
    (`ray`: an address, "" or True for a local instance), restarting the workers up to `max_restarts` times,
    after `check_inputs(cfg)` under --out's lock. `keeps(out)`: what a failed launch leaves for a rerun. The
    launch's Ray files and error messages go to a hidden directory beside --out (removed afterwards)."""
    from genome_lm.parallel.launch import Job, run_local, run_ray

    if nproc is not None:
        layout(cfg.cp, nproc)
    if not cfg.out:
        check_inputs(cfg)  # refuses it
    out = Path(cfg.out)
    with holding(out, command):  # the workers' rank 0 works under this lock (outputs.HOLDER_ENV)
        check_inputs(cfg)
        job = Job(fn=fn, args=(cfg.model_dump(mode="json"),), layout=lambda world: layout(cfg.cp, world),
                  describe=f"{command}: cp={cfg.cp}, dp=processes/cp", keeps=keeps(out),
                  work_dir=out.parent / f".{out.name}.launch", name=f"{command}-{out.name}")
        try:
            if ray is None:
                run_local(job, nproc or 1, max_restarts)
            else:
                run_ray(job, address=ray if isinstance(ray, str) and ray else None, nproc=nproc,
                        max_restarts=max_restarts)
        finally:
            shutil.rmtree(job.work_dir, ignore_errors=True)


def scored_rounds(par, model, todo: list[int], forwards: Sequence[int], score: Callable[[int], Any]):
    """Score the items `todo` (windows, regions) in rounds of one per dp replica, `score(i)` making
    `forwards[i]` forward passes. A replica with less to do makes forwards that score nothing, so that its
    FSDP2 all-gathers (and its CP group's collectives) meet those of the replicas still scoring. Yields per
    round, on rank 0, the (i, score(i)) of every replica's first CP rank in dp order; other ranks: []."""
    from genome_lm.eval.scoring import IGNORE_INDEX, score_piece

    for r in range(0, len(todo), par.dp):
        batch = list(todo[r : r + par.dp])
        i = batch[par.dp_rank] if par.dp_rank < len(batch) else None
        mine = None if i is None else (i, score(i))
        for _ in range(max(int(forwards[j]) for j in batch) - (int(forwards[i]) if i is not None else 0)):
            ids = torch.zeros(1, IDLE_TOKENS_PER_RANK * par.cp, dtype=torch.int64)
            score_piece(model, ids, torch.full_like(ids, IGNORE_INDEX))
        if not par.distributed:
            yield [] if mine is None else [mine]
            continue
        box: list | None = [None] * par.world if par.is_main else None  # the gather's list, on rank 0 only
        dist.gather_object(mine if par.cp_rank == 0 else None, box, dst=0)
        yield [x for x in box if x is not None] if box is not None else []
