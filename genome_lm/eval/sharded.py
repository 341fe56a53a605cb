"""Eval over several processes (docs/parallel.md, Distributed eval): what differs from one process in the
`evaluate` every rank runs: the dp x cp layout, the FSDP2 model, the scoring rounds, the gather on rank 0."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from genome_lm.errors import GenomeLMError
from genome_lm.parallel.layout import LayoutWords, resolve_layout

IDLE_TOKENS_PER_RANK = 8  # tokens per CP rank of an idle forward

EVAL_WORDS = LayoutWords(
    no_world="--nproc {world}: the number of processes must be >= 1",
    too_few="--cp {cp} splits each window (region) over {cp} processes, this launch has {world}; {nproc} {cp} "
            "(or a multiple of {cp}), or lower --cp",
    not_divisor="--cp {cp} does not divide the {world} processes of this launch (dp = processes / cp); use --nproc "
                "{lower} or {upper}, or a --cp that divides {world}",
    dp_mismatch="",  # dp is always processes / cp
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
    if cp == 1:
        return
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
    model = built.model
    parallelize(model, memory, par)  # in place
    load_weights_(model, model_dir, par.device, dtype=built.dtype)
    return model


@dataclass
class Round:
    windows: list[int | None]  # [dp] the window each replica scores (None: none left for it)
    forwards: int  # forward passes every replica makes: the most pieces of the round's windows


def rounds(todo: list[int], pieces: list[int] | np.ndarray, dp: int) -> list[Round]:
    """`todo` windows in rounds of one window per dp replica; `pieces[i]` forwards window i takes."""
    out = []
    for r in range(0, len(todo), dp):
        windows = list(todo[r : r + dp])
        out.append(Round(windows + [None] * (dp - len(windows)), max(int(pieces[i]) for i in windows)))
    return out


def idle_forward(model, cp: int) -> None:
    """A forward that scores nothing, so that this replica's FSDP2 all-gathers (and its CP group's
    collectives) meet those of the replicas still scoring."""
    from genome_lm.eval.scoring import IGNORE_INDEX, score_piece

    ids = torch.zeros(1, IDLE_TOKENS_PER_RANK * cp, dtype=torch.int64)
    score_piece(model, ids, torch.full_like(ids, IGNORE_INDEX))


def gather_on_main(par, item):
    """Rank 0: the non-None `item`s of every replica's first CP rank, in dp order; other ranks: []."""
    if not par.distributed:
        return [] if item is None else [item]
    box: list | None = [None] * par.world if par.is_main else None  # the gather's list, on rank 0 only
    dist.gather_object(item if par.cp_rank == 0 else None, box, dst=0)
    return [x for x in box if x is not None] if box is not None else []
