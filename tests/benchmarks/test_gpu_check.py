"""`benchmarks/gpu_check.py --device cpu`: the prepared GPU check runs every check at tiny sizes on
CPU, so it keeps working between the runs on a GPU."""

import json

import pytest
import torch

from tests.helpers import load_benchmark


def _load():
    return load_benchmark("gpu_check")


def test_gpu_check_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert _load().main(["--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["checks"]) == {"kda", "offload", "fsdp", "fp32_experts", "eval", "throughput"}
    assert all(check["ok"] for check in result["checks"].values())
    assert result["checks"]["offload"]["loss"][0] == result["checks"]["offload"]["loss"][1]
    assert result["checks"]["throughput"]["tokens_per_s"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (make test-gpu)")
def test_gpu_check_on_cuda():
    """The full-size check on the GPU; its JSON is the record (benchmarks/results/gpu_check.json)."""
    assert _load().main(["--device", "cuda"]) == 0
