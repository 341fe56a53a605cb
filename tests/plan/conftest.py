"""Shared fixtures of the planner tests: synthetic shards with windows long enough for 16k steps."""

from __future__ import annotations

import pytest

from genome_lm.genome.prepare import PrepareParams, prepare
from genome_lm.genome.synth import write_synthetic_fasta


@pytest.fixture(scope="session")
def long_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan_genome")
    fasta = root / "genome.fa.gz"
    write_synthetic_fasta(fasta, scale=0.1, seed=3)
    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms="chr1,chr2", eval_chroms="chr22",
                                    seq_len="16k", min_len="16k")
    prepare(params, root / "shards", show_progress=False)
    return root / "shards"
