"""Small eval inputs and outputs made in code, shared by tests/eval and tests/report.

One tiny synthetic genome (chr22 held out, 1k-token windows), two `glm53-tiny` checkpoints
(random initialisations, seeds 0 and 1), and their evals on the first few windows. Built once
per test session, by the `eval_inputs` and `evaluated` fixtures of tests/conftest.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

N_WINDOWS = 3


def eval_inputs(root: Path) -> SimpleNamespace:
    """Shards of chr1 (train) and chr22 (eval) in 1k windows, and the seed-0 and seed-1 checkpoints."""
    from genome_lm.model import save_pretrained
    from tests.helpers import make_shards, tiny_model

    shards = make_shards(root, train_chroms="chr1", seq_len="1k", min_len="256")
    for seed in (0, 1):
        save_pretrained(tiny_model(seed), root / f"ckpt{seed}")
    return SimpleNamespace(root=root, shards=shards, ckpt0=root / "ckpt0", ckpt1=root / "ckpt1")


def evaluated(inputs: SimpleNamespace, out: Path) -> SimpleNamespace:
    """`inputs` plus eval0/eval1 (both checkpoints, first N_WINDOWS windows), a compare dir and a run dir."""
    from genome_lm.eval import EvalConfig, evaluate, write_compare

    for i, ckpt in enumerate((inputs.ckpt0, inputs.ckpt1)):
        evaluate(EvalConfig(checkpoint=str(ckpt), shards=str(inputs.shards), out=str(out / f"eval{i}"),
                            max_windows=N_WINDOWS, resamples=500), show_progress=False)
    write_compare(out / "eval0", out / "eval1", out / "cmp01", resamples=500)
    run = write_fake_run(out / "run")
    return SimpleNamespace(**vars(inputs), eval0=out / "eval0", eval1=out / "eval1", cmp01=out / "cmp01", run=run)


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


# The "strata" genome: segmental duplications of chr1 planted in chr22, so that `prepare --leakage-k 32`
# marks some eval tokens (windows 3 and 4 of the eval split, 1k windows).
STRATA_GENOME = dict(segdup_count=40, segdup_min_len=200, segdup_max_len=600, segdup_region=(0.1, 0.4))
STRATA_WINDOWS = 5
ABLATION = [64, 256, 800]  # --context of the strata evals (windows of 927 and 1024 tokens: t0 >= 812)


def strata_inputs(root: Path) -> SimpleNamespace:
    """Shards with a leakage mask (chr1 train, chr22 eval, 1k windows, --leakage-k 32)."""
    from genome_lm.genome.params import SynthParams
    from genome_lm.genome.prepare import PrepareParams, prepare
    from genome_lm.genome.synth import write_synthetic_fasta

    fasta = root / "genome.fa.gz"
    write_synthetic_fasta(fasta, scale=0.05, seed=3, params=SynthParams(**STRATA_GENOME))
    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms="chr1", eval_chroms="chr22", seq_len="1k",
                                    min_len="256", leakage_k=32)
    prepare(params, root / "shards", show_progress=False)
    return SimpleNamespace(root=root, fasta=fasta, shards=root / "shards", **write_beds(root, fasta))


def write_beds(root: Path, fasta: Path) -> dict:
    """Two BED files over chr22: the planted segmental duplications (`segdups.bed`, names 'chr22') and
    stripes [100 k, 100 k + 30) (`stripes.bed`, names '22', a header and a comment line)."""
    import csv

    with open(fasta.with_name(fasta.name.replace(".fa.gz", ".segdups.tsv"))) as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["chrom"] == "chr22"]
    segdups = root / "segdups.bed"
    segdups.write_text("".join(f"{r['chrom']}\t{r['start']}\t{r['end']}\tdup\t0\t{r['strand']}\n" for r in rows))
    stripes = root / "stripes.bed"
    stripes.write_text("track name=stripes\n# every 100 bases, 30 long\n"
                       + "".join(f"22 {p} {p + STRIPE}\n" for p in range(0, 60_000, 100)))
    return {"segdups_bed": segdups, "stripes_bed": stripes}


STRIPE = 30


def strata_evaluated(inputs: SimpleNamespace, strata: SimpleNamespace, out: Path, **flags) -> SimpleNamespace:
    """Both checkpoints of `inputs` on the first STRATA_WINDOWS windows of `strata`'s shards, with every
    optional analysis (leakage-marked shards, two --annotate files, --context ABLATION, --strands both;
    `flags` update them), and their comparison."""
    from genome_lm.eval import EvalConfig, evaluate, write_compare

    flags = {"annotate": [str(strata.segdups_bed), f"{strata.stripes_bed}:stripes"], "context": ABLATION,
             "strands": "both", **flags}
    for i, ckpt in enumerate((inputs.ckpt0, inputs.ckpt1)):
        evaluate(EvalConfig(checkpoint=str(ckpt), shards=str(strata.shards), out=str(out / f"eval{i}"),
                            max_windows=STRATA_WINDOWS, resamples=300, **flags), show_progress=False)
    write_compare(out / "eval0", out / "eval1", out / "cmp01", resamples=300)
    return SimpleNamespace(**vars(strata), ckpt0=inputs.ckpt0, ckpt1=inputs.ckpt1, eval0=out / "eval0",
                           eval1=out / "eval1", cmp01=out / "cmp01")
