"""Distributed tests: several processes with gloo on CPU, tiny synthetic shards."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory):
    from genome_lm.genome.prepare import PrepareParams, prepare
    from genome_lm.genome.synth import write_synthetic_fasta

    root = tmp_path_factory.mktemp("tiny_genome_parallel")
    fasta = root / "tiny.fa.gz"
    write_synthetic_fasta(fasta, scale=0.05, seed=3)
    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms="chr1,chr2", eval_chroms="chr22",
                                    seq_len="4k", min_len="512", reverse_complement=True)
    prepare(params, root / "shards", show_progress=False)
    return root / "shards"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, world: int, port: int, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from datetime import timedelta

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int, *args, timeout: float = 300) -> None:
    """Run `fn(rank, world, *args)` on `world` fresh processes with a gloo group; fail on any
    error or after `timeout` seconds (the processes are killed)."""
    ctx = mp.start_processes(_entry, args=(fn, world, free_port(), args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.time() + timeout
    try:
        while not ctx.join(timeout=5):
            if time.time() > deadline:
                raise TimeoutError(f"{fn.__name__} on {world} processes did not finish in {timeout} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def write_experiment(path, shards, **sections) -> str:
    """A small glm53-tiny experiment YAML; `sections` update the defaults section by section."""
    import yaml

    cfg = {
        "data": {"shards": str(shards), "seq_len": 64, "seed": 0},
        "model": {"name": "glm53-tiny"},
        "train": {"steps": 4, "micro_batch": 1, "lr": 3.0e-3, "warmup_steps": 0, "checkpoint_every": 2,
                  "keep_checkpoints": 2, "seed": 0},
        "log": {"wandb": "disabled"},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path.write_text(yaml.safe_dump(cfg))
    return str(path)
