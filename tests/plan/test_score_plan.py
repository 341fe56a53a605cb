"""`plan_score` (what `genome-lm plan --score` prints) against the streaming scorer it plans: the
carried state exactly, and the peak as a conservative bound, measured by `LiveBytes`
(benchmarks/bench_score_memory.py: every tensor storage made while scoring, weights excluded).
At GLM-5.3-Flash widths (fake tensors, as the rehearsal) the rule of tests/plan/test_bound.py holds:
never more than 1% below the measurement, at most 6% above. On glm53-tiny (real float32 tensors)
the indexer's float32 k-pool terms dominate a small peak: at most 25% above."""

from __future__ import annotations

import json

import pytest

from genome_lm.cli import main
from tests.helpers import load_benchmark, tiny_model

BELOW, ABOVE = 0.01, 0.06


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_score_memory")


def check(r: dict, above: float) -> None:
    assert r["measured_dsa_caches"] == r["planned_dsa_caches"] > 0
    assert r["measured_kda_state"] == r["planned_kda_state"] > 0
    assert 1 - BELOW <= r["planned_peak"] / r["measured_peak"] <= 1 + above, r


@pytest.mark.parametrize("T, chunk", [(2048, 512), (4096, 1024)])
def test_tiny_streaming_peak_is_bounded(bench, T, chunk):
    from genome_lm.model import apply_long_context

    check(bench.measure(apply_long_context(tiny_model(0)).eval(), T, chunk, fake=False), above=0.25)


def test_real_width_streaming_peak_is_bounded(bench):
    """A KDA+MoE and a DSA+MoE layer at real width (8 experts): the DSA layer's attention is the peak."""
    r = bench.measure(bench.real_width_model(8), 8192, 2048, fake=True)
    assert r["measured_dsa_caches"] == 8192 * 2 * (512 + 2 * 128 + 1)  # latent, index keys | gates | valid, bf16
    assert r["measured_kda_state"] == 64 * 128 * 128 * 4 + 3 * 64 * 128 * 4 * 2 + 8  # float32 state, conv tail
    assert r["planned_where"].endswith("dsa_attention")
    check(r, above=ABOVE)


def test_plan_score_command(capsys):
    assert main(["plan", "--model", "glm53-tiny", "--score", "64k", "--chunk", "4k", "--gpu", "h100", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert sum(plan["breakdown"].values()) == plan["peak_bytes"] and plan["fits"]
    assert plan["longest_region"] > 2**20  # a tiny model: far more than the planned region
    assert main(["plan", "--model", "glm53-flash", "--score", "1M", "--chunk", "4k", "--gpu", "h200", "--gpus",
                 "8"]) == 0
    out = capsys.readouterr().out
    assert "DSA caches" in out and "16.52 GiB" in out  # 11 layers x 1M x (512 + 2 x 128 + 1) x 2 bytes
    assert "does not fit" in out and "longest region that fits: " in out
    small = ["plan", "--model", "glm53-flash", "--score", "1M", "--chunk", "4k", "--gpus", "8", "--json"]
    assert main(small) == 0 and main([*small, "--set", "memory.dsa_block_queries=256"]) == 0
    default, blocks = (json.loads(o) for o in capsys.readouterr().out.replace("}\n{", "}\n\0{").split("\0"))
    assert blocks["breakdown"]["activations"] < default["breakdown"]["activations"] / 2  # the gathered rows
    assert blocks["breakdown"]["dsa_caches"] == default["breakdown"]["dsa_caches"]
    assert main(["plan", "--model", "glm53-flash", "--score", "1M", "--fit"]) != 0
    assert "--fit and --seq-len are for training plans" in capsys.readouterr().err
