"""Shared test helpers: one closeness check, one tiny model, the largest tensor an op creates, the
synthetic shards and experiment files, and gloo process groups (import as `from tests.helpers import ...`).

Light to import: torch, the model and the genome code are imported where a helper needs them
(importing the model costs seconds; tests/conftest.py hides CUDA before torch is imported).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def load_benchmark(name: str):
    """The module benchmarks/NAME.py (benchmarks are scripts, not a package), imported by path."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_close(name: str, got, ref, tol: float, *, floor: float | None = 1.0) -> float:
    """Assert max |got - ref| <= tol * max(floor, max |ref|) and return the error relative to that scale.

    `floor=1.0` (the default): relative to the reference's largest value, absolute where that is
    below 1. `floor=0.0`: relative to max |ref| alone; a small `floor` (1e-6) only keeps a zero
    reference from dividing by zero. `floor=None`: absolute, max |got - ref| <= tol. An all-zero
    (or empty) reference counts as scale 1. `ref` has `got`'s shape or broadcasts to it (a scalar
    zero: all of `got` is 0). The difference is taken in float64; the message names the tensor,
    the error, the scale and the relative error.
    """
    import torch

    got, ref = torch.as_tensor(got).detach().double(), torch.as_tensor(ref).detach().double()
    try:
        fits = torch.broadcast_shapes(got.shape, ref.shape) == got.shape
    except RuntimeError:
        fits = False
    assert fits, f"{name}: shape {tuple(got.shape)}, reference {tuple(ref.shape)}"
    diff = got - ref
    err = diff.abs().max().item() if diff.numel() else 0.0
    if floor is None:
        scale = 1.0
    else:
        scale = max(floor, ref.abs().max().item() if ref.numel() else 0.0) or 1.0
    assert err <= tol * scale, (
        f"{name}: max |got - ref| {err:.3g} > {tol:g} * {scale:.3g} (relative error {err / scale:.3g})"
    )
    return err / scale


def largest_tensor():
    """A torch dispatch mode that records, in `.largest`, the most elements of any tensor an op creates
    while it is active (forward and backward): `with largest_tensor() as mode: ...`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestTensor(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel())
            return out

    return LargestTensor()


GRAD_FLOOR = 1e-3


def assert_grads_close(what: str, got: dict, ref: dict, tol: float) -> float:
    """Both dicts name the same parameters, and each gradient is within `tol` of the reference's,
    relative to max(its own largest value, GRAD_FLOOR x the largest of all the reference's gradients).
    The floor is float32's: a gradient a thousand times smaller than the model's largest is a sum of
    terms of the model's size that cancel, so its rounding error scales with them, not with it
    (docs/testing.md, "Tolerances"). Returns the worst relative error."""
    assert got.keys() == ref.keys(), f"{what}: parameters {sorted(set(got) ^ set(ref))} in one only"
    model_scale = max((float(g.abs().max()) for g in ref.values() if g.numel()), default=1.0)
    return max((assert_close(f"{what}: gradient of {name}", got[name], r, tol, floor=GRAD_FLOOR * model_scale)
                for name, r in ref.items()), default=0.0)


def tiny_model(seed: int = 0, *, router_bias: float | None = None, **overrides):
    """`build("glm53-tiny", **overrides)` after `torch.manual_seed(seed)`. `router_bias` (a std)
    then draws every MoE router's `e_score_correction_bias`, layer by layer (upstream inits it to 0;
    a drawn one makes it count in checkpoint tests)."""
    import torch

    from genome_lm.model import build

    torch.manual_seed(seed)
    model = build("glm53-tiny", **overrides).model
    if router_bias is not None:
        for layer in model.model.layers:
            bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.normal_(std=router_bias)
    return model


def make_shards(root: Path, *, scale: float = 0.05, seed: int = 3, train_chroms: str = "chr1,chr2",
                eval_chroms: str = "chr22", seq_len: str = "4k", min_len: str = "512",
                reverse_complement: bool = False) -> Path:
    """Write the synthetic genome (`write_synthetic_fasta(scale, seed)`) to `root` and prepare shards
    from it; returns `root / "shards"`. The defaults are those of the `tiny_shards` fixture but for
    its reverse-complement copies."""
    from genome_lm.genome.prepare import PrepareParams, prepare
    from genome_lm.genome.synth import write_synthetic_fasta

    root = Path(root)
    fasta = root / "genome.fa.gz"
    write_synthetic_fasta(fasta, scale=scale, seed=seed)
    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms=train_chroms, eval_chroms=eval_chroms,
                                    seq_len=seq_len, min_len=min_len, reverse_complement=reverse_complement)
    prepare(params, root / "shards", show_progress=False)
    return root / "shards"


def write_experiment(path: Path, shards, *, micro_batch: int = 2, **sections) -> str:
    """A small glm53-tiny experiment YAML at `path` (4 steps of `micro_batch` 64-token windows);
    `sections` update the defaults section by section. Returns the path as a string."""
    import yaml

    cfg = {
        "data": {"shards": str(shards), "seq_len": 64, "seed": 0},
        "model": {"name": "glm53-tiny"},
        "train": {"steps": 4, "micro_batch": micro_batch, "lr": 3.0e-3, "warmup_steps": 0, "checkpoint_every": 2,
                  "keep_checkpoints": 2, "seed": 0},
        "log": {"wandb": "disabled"},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    Path(path).write_text(yaml.safe_dump(cfg))
    return str(path)


def _entry(rank: int, fn, world: int, port: int, args: tuple) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        fn(rank, world, *args)
        dist.barrier()  # no rank tears the group down while a peer still works (gloo can abort the early one)
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int, *args, timeout: float = 300) -> None:
    """Run `fn(rank, world, *args)` on `world` fresh processes with a gloo group; fail on any
    error or after `timeout` seconds (the processes are killed)."""
    import torch.multiprocessing as mp

    from genome_lm.parallel.launch import free_port

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
