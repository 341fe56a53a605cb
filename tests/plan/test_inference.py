"""`plan_forward` (what `genome-lm eval --dry-run` prints) by hand on GLM-5.3-Flash's shape: the
FSDP2 terms follow the parameter counts, the activations the slab. Its activation terms against
a measured forward: benchmarks/bench_eval.py (docs/parallel.md)."""

from __future__ import annotations

import pytest

from genome_lm.plan.layout import Layout
from genome_lm.plan.memory import plan_forward
from genome_lm.plan.shapes import model_shape


@pytest.fixture(scope="module")
def flash():
    return model_shape("glm53-flash", "bfloat16")


def test_sharded_terms_by_hand(flash):
    layout = Layout(2**19).replace(cp=8, dp=8, moe_recompute=True)
    plan = plan_forward(flash, layout)
    b = plan.breakdown
    assert b["weights"] == plan.weights_bytes == flash.param_bytes // 64
    assert b["root_gathered"] == flash.root_param_bytes
    at = int(plan.peak_where.split()[3])  # "forward of layer i (...)"
    assert b["layer_gathered"] == 2 * flash.layers[at].param_bytes  # the running layer + one prefetched
    assert b["streams"] == 2 * 2**16 * 2 * flash.S * flash.D  # slab of 65,536 tokens in and out, bf16
    assert sum(b.values()) == plan.peak_bytes
    # twice the window: the activation terms double, the parameter terms stay
    long = plan_forward(flash, layout.replace(seq_len=2**20)).breakdown
    assert long["streams"] == 2 * b["streams"]
    assert b["op"] < long["op"] <= 2 * b["op"]  # at most in proportion: some temporaries are per block of tokens
    assert long["weights"] == b["weights"]


def test_one_process_holds_the_whole_model_and_gathers_nothing(flash):
    plan = plan_forward(flash, Layout(4096).replace(moe_recompute=True))
    assert plan.breakdown["weights"] == flash.param_bytes
    assert "root_gathered" not in plan.breakdown and "layer_gathered" not in plan.breakdown
