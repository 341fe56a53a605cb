"""Small eval inputs and outputs made in code, shared by tests/eval and tests/report.

One tiny synthetic genome (chr22 held out, 1k-token windows), two `glm53-tiny` checkpoints
(random initialisations, seeds 0 and 1), and their evals on the first few windows. Built once
per test session.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

N_WINDOWS = 3
_CACHE: dict = {}


def _inputs(root: Path) -> SimpleNamespace:
    import torch

    from genome_lm.genome.prepare import PrepareParams, prepare
    from genome_lm.genome.synth import write_synthetic_fasta
    from genome_lm.model import build, save_pretrained

    fasta = root / "tiny.fa.gz"
    write_synthetic_fasta(fasta, scale=0.05, seed=3)
    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms="chr1", eval_chroms="chr22", seq_len="1k",
                                    min_len="256")
    prepare(params, root / "shards", show_progress=False)
    ckpts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        save_pretrained(build("glm53-tiny"), root / f"ckpt{seed}")
        ckpts.append(root / f"ckpt{seed}")
    return SimpleNamespace(root=root, shards=root / "shards", ckpt0=ckpts[0], ckpt1=ckpts[1])


def eval_inputs(tmp_path_factory) -> SimpleNamespace:
    if "inputs" not in _CACHE:
        _CACHE["inputs"] = _inputs(tmp_path_factory.mktemp("eval_inputs"))
    return _CACHE["inputs"]


def evaluated(tmp_path_factory) -> SimpleNamespace:
    """eval_inputs plus eval0/eval1 (both checkpoints, first N_WINDOWS windows), a compare dir and a run dir."""
    if "evals" not in _CACHE:
        from genome_lm.eval import EvalConfig, evaluate, write_compare

        d = eval_inputs(tmp_path_factory)
        out = tmp_path_factory.mktemp("evals")
        for i, ckpt in enumerate((d.ckpt0, d.ckpt1)):
            evaluate(EvalConfig(checkpoint=str(ckpt), shards=str(d.shards), out=str(out / f"eval{i}"),
                                max_windows=N_WINDOWS, resamples=500), show_progress=False)
        write_compare(out / "eval0", out / "eval1", out / "cmp01", resamples=500)
        run = write_fake_run(out / "run")
        _CACHE["evals"] = SimpleNamespace(**vars(d), eval0=out / "eval0", eval1=out / "eval1", cmp01=out / "cmp01",
                                          run=run)
    return _CACHE["evals"]


def write_fake_run(run_dir: Path, steps: int = 30) -> Path:
    """A run directory whose metrics.jsonl looks like the trainer's (decaying loss, warmup + cosine lr)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            lr = 1e-3 * min(1.0, step / 5) * (0.55 + 0.45 * np.cos(np.pi * step / steps))
            f.write(json.dumps({"step": step, "loss": 2.8 * np.exp(-step / 20) + 1.3 + 0.02 * rng.standard_normal(),
                                "lr": lr, "grad_norm": 1.0, "tokens_per_s": 5000 + 100 * rng.standard_normal(),
                                "peak_mem_bytes": int(1.5 * 2**30)}) + "\n")
    return run_dir
