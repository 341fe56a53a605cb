"""`benchmarks/probe_copy_learning.py --position-test`: seven variants on a copy of W/4 bases from
3W/8 back, and the one that restarts the KDA and the attention at W scores exactly what a fresh
sequence does (that the patches reach the model: tests/test_probe_context_reach.py)."""

import torch

from tests.helpers import load_benchmark


def test_position_test_has_seven_variants_and_restart_equals_fresh():
    from genome_lm.model import apply_long_context, build

    probe = load_benchmark("probe_copy_learning")
    torch.manual_seed(0)
    model = apply_long_context(build("glm53-demo", dtype="float32").model).eval()
    result = probe.position_test(model, W=32, batch=4)
    rows = {r["variant"]: r["copied_nll"] for r in result["rows"]}
    assert len(rows) == 7 and (result["copy_length"], result["copy_distance"]) == (8, 12)
    assert result["max_abs_diff"] <= 1e-5
    assert abs(rows["fresh: the last 32 tokens alone"] - rows["KDA and attention restart at 32"]) <= 1e-6
