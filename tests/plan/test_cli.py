"""`genome-lm plan` from the command line: JSON fields, the report, --fit, and one-line errors."""

from __future__ import annotations

import json

import pytest

from genome_lm.cli import main
from genome_lm.plan.hardware import GiB
from tests.helpers import load_benchmark

EXP_1M = "experiments/glm53flash_1m_64xb200.yaml"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_promised_fields(capsys):
    code, out, _ = run(capsys, EXP_1M, "--gpus", "64", "--json")
    assert code == 0
    plan = json.loads(out)
    for key in ("peak_gpu_bytes", "host_bytes_per_gpu", "step_time_s", "tokens_per_s", "fits", "breakdown"):
        assert key in plan
    assert sum(plan["breakdown"].values()) == plan["peak_gpu_bytes"]
    assert plan["layout"]["parallel"]["cp"] == 8 and plan["layout"]["parallel"]["dp"] == 8
    assert plan["layout"]["memory"]["offload_layer_inputs"] is True
    assert 175 * GiB < plan["host_bytes_per_gpu"] < 177 * GiB  # 44 x 4 GiB layer inputs (the last stays)
    # the reference layout fits a B200 (179 GiB) with the margins (about 141 GiB: the peak is layer 3's DSA
    # backward, which the full-size rehearsal measures within 1%), in <= 190 GB of host memory
    assert plan["fits"] and plan["needed_gpu_gib"] <= 145 and plan["host_bytes_per_gpu"] <= 190e9
    assert plan["assumptions"]["expert_imbalance"] == 4.0


def test_readable_report_and_overrides(capsys):
    code, out, _ = run(capsys, "--model", "glm53-flash", "--seq-len", "256k", "--gpus", "64", "--cp", "8",
                       "--recompute", "per-layer", "--offload", "--gpu", "h200", "--assume", "matmul_efficiency=0.3")
    assert code == 0
    assert "peak per GPU" in out and "host memory" in out and "tokens/s" in out
    assert "matmul_efficiency = 0.3" in out and "cp=8 dp=8" in out


def test_assume_takes_what_gpu_check_measured(capsys, tmp_path):
    measured = tmp_path / "gpu_check.json"
    measured.write_text(json.dumps({"checks": {}, "assume": {"matmul_efficiency": 0.21}}))
    code, out, _ = run(capsys, EXP_1M, "--gpus", "64", "--assume", str(measured))
    assert code == 0 and "matmul_efficiency = 0.21" in out
    measured.write_text(json.dumps({"checks": {}}))
    code, _, err = run(capsys, EXP_1M, "--gpus", "64", "--assume", str(measured))
    assert code == 2 and "no 'assume' object" in err and len(err.strip().splitlines()) == 1


def test_fit_finds_a_layout_where_the_naive_one_does_not_fit(capsys):
    code, out, _ = run(capsys, "--model", "glm53-flash", "--seq-len", "256k", "--gpus", "64", "--fit", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["fit"]["given"]["fits"] is False  # cp=1, no recompute: one 256k sequence per GPU
    assert plan["fit"]["found"] is True and plan["fits"] is True
    assert plan["peak_gpu_bytes"] < plan["fit"]["given"]["peak_gpu_bytes"]
    assert any("chosen" in line for line in plan["fit"]["explanation"])


def test_fit_exits_non_zero_when_nothing_fits(capsys):
    code, out, err = run(capsys, "--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--fit")
    assert code == 2
    assert "nothing fits" in out and "lowest peak" in out  # the closest layout's report
    assert err.count("\n") == 1 and "plan --fit: nothing fits among" in err, err


def test_fit_and_the_table_choose_the_same_layout_with_expert_parallelism_by_default(capsys):
    """`plan --fit` and benchmarks/plan_table.py answer one question with one search, which tries expert
    parallelism unless --ep fixes it: at 2M tokens on 64 B200s it chooses ep > 1."""
    code, out, _ = run(capsys, EXP_1M, "--seq-len", "1M", "--gpus", "64", "--gpu", "h200", "--fit", "--json")
    assert code == 0
    table = load_benchmark("plan_table")
    assert table.row("h200", 64, "1M", None)["layout"] == json.loads(out)["fit"]["chosen"]
    code, out, _ = run(capsys, "--model", "glm53-flash", "--seq-len", "2m", "--gpus", "64", "--fit", "--json")
    chosen = json.loads(out)["layout"]
    assert code == 0 and chosen["parallel"]["ep"] > 1, chosen


@pytest.mark.parametrize("argv, message", [
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--gpu", "a100"], "unknown GPU"),
    (["--model", "glm53-tiny", "--seq-len", "64"], "plan --model glm53-tiny: give --gpus N (with --model, the layout "
                                                    "is data parallel over N GPUs)"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--gpu-mem", "0GiB"], "--gpu-mem"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--gpu-mem", "lots"], "--gpu-mem"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--gpu-mem", "512MiB"], "--gpu-mem"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--host-mem=-2TiB"], "--host-mem"),
    (["--model", "glm53-flash", "--seq-len", "12q", "--gpus", "8"], "--seq-len: cannot read"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "0"], "--gpus"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "12"], "--gpus"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--cp", "3"], "--cp"),
    (["--model", "glm53-flash", "--gpus", "8"], "--seq-len"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--assume", "speed=11"], "--assume"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--assume", "matmul_efficiency=2"],
     "matmul_efficiency"),
    (["--model", "glm53-flash", "--seq-len", "1M", "--gpus", "8", "--assume", "matmul_efficiency"],
     "expected KEY=VALUE, e.g. --assume matmul_efficiency=VALUE"),  # an assumption's key, not a train key
    (["--model", "nope-model", "--seq-len", "1M", "--gpus", "8"], "nope-model"),
    ([EXP_1M, "--gpus", "64", "--set", "memory.recompute=sometimes"], "memory.recompute"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("genome-lm plan: error:") and message in err, err


def test_rehearse_refuses_float32_experts_without_expert_parallelism_in_one_line(capsys):
    code = main(["rehearse", EXP_1M, "--gpus", "64", "--set", "model.dtype=float32", "--set", "parallel.ep=1"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1, err
    assert "model.dtype is float32" in err and "--set model.dtype=bfloat16" in err
