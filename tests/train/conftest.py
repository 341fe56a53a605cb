"""Tiny synthetic shards shared by the trainer tests (made once per session)."""

from __future__ import annotations

import pytest

from genome_lm.genome.prepare import PrepareParams, prepare
from genome_lm.genome.synth import write_synthetic_fasta


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_genome")
    fasta = root / "tiny.fa.gz"
    write_synthetic_fasta(fasta, scale=0.05, seed=3)
    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms="chr1,chr2", eval_chroms="chr22",
                                    seq_len="4k", min_len="512", reverse_complement=True)
    prepare(params, root / "shards", show_progress=False)
    return root / "shards"


def write_experiment(path, shards, **sections) -> str:
    """A small glm53-tiny experiment YAML; `sections` update the defaults section by section."""
    import yaml

    cfg = {
        "data": {"shards": str(shards), "seq_len": 64, "seed": 0},
        "model": {"name": "glm53-tiny"},
        "train": {"steps": 4, "micro_batch": 2, "lr": 3.0e-3, "warmup_steps": 0, "checkpoint_every": 2,
                  "keep_checkpoints": 2, "seed": 0},
        "log": {"wandb": "disabled"},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path.write_text(yaml.safe_dump(cfg))
    return str(path)
