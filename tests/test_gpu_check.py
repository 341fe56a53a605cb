"""`benchmarks/gpu_check.py --device cpu`: the prepared GPU check runs every check at tiny sizes on
CPU, so it cannot rot between the sessions that have a GPU to run it on."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["checks"]) == {"kda", "offload", "fsdp", "fp32_experts", "eval", "throughput"}
    assert all(check["ok"] for check in result["checks"].values())
    assert result["checks"]["offload"]["loss"][0] == result["checks"]["offload"]["loss"][1]
    assert result["checks"]["throughput"]["tokens_per_s"] > 0
