"""The planner's CPU prediction against the real trainer's logged peak memory (glm53-tiny).

A subprocess runs `genome_lm.train.train` for one step per case (`calibrate_worker.py`) and
reports `peak_mem_bytes` from metrics.jsonl (the process's peak resident set during the step) and
the resident set right before the step (the baseline: interpreter, torch, model, optimizer).
The planner predicts baseline + the step's gradients, activations and transients, from the
model's shapes alone; nothing is fitted. Both the whole peak and the step's own part
(peak - baseline) must be within 20% of the measurement.

The worker runs with glibc's mmap threshold fixed at its default 128 KiB (MALLOC_MMAP_THRESHOLD_):
every tensor of 128 KiB or more is then its own mapping, returned to the OS when freed, so the
resident set follows live tensors the way `torch.cuda.max_memory_allocated` does on a GPU. With
the dynamic threshold glibc keeps freed blocks in its heap and the resident set depends on
allocation history (docs/plan.md shows both).

The default run checks one case; `-m slow` checks 3 sequence lengths x 2 strategies, plus
offload, selective recompute, MoE block recompute, and cases whose peak is an op's transient
(DSA indexer scores, DSA sparse-attention backward, MoE block, LM-head chunk; the last two with
glm53-tiny config overrides that make that op large).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from genome_lm.config import MemoryConfig
from genome_lm.plan.hardware import Assumptions
from genome_lm.plan.layout import Layout
from genome_lm.plan.planner import make_plan
from genome_lm.plan.shapes import model_shape

WORKER = Path(__file__).with_name("calibrate_worker.py")
TOLERANCE = 0.20
# The trainer's offload releases each checkpointed layer's device input after the forward (the
# default assumption; `offload_keeps_device_input` models an offload that keeps it alive).
ASSUME = Assumptions()


def measure(shards: Path, out: Path, cases: list[dict]) -> list[dict]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, str(WORKER), str(shards), str(out), json.dumps(cases)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def predict(row: dict):
    layout = Layout(row["tokens"], MemoryConfig(**row["memory"]))
    return make_plan(model_shape("glm53-tiny", "float32", row.get("model_overrides")), layout, None, ASSUME,
                     process_baseline_bytes=row["baseline_bytes"])


def check(rows: list[dict]) -> list[str]:
    report, bad = [], []
    for row in rows:
        plan = predict(row)
        peak, base = row["peak_mem_bytes"], row["baseline_bytes"]
        step_pred, step_meas = plan.memory.peak_bytes, peak - base
        err_peak, err_step = plan.peak_gpu_bytes / peak - 1, step_pred / step_meas - 1
        line = (f"T={row['tokens']:>6} {json.dumps(row['memory']):<70} measured {peak / 2**20:7.0f} MiB "
                f"(step {step_meas / 2**20:6.0f}) predicted {plan.peak_gpu_bytes / 2**20:7.0f} MiB "
                f"(step {step_pred / 2**20:6.0f}): {err_peak:+.1%} / {err_step:+.1%}")
        report.append(line)
        if abs(err_peak) > TOLERANCE or abs(err_step) > TOLERANCE:
            bad.append(line)
    print("\n".join(report))
    return bad


def test_planner_matches_trainer_one_case(long_shards, tmp_path):
    rows = measure(long_shards, tmp_path, [{"seq_len": 8192, "memory": {"recompute": "per-layer"}},
                                           {"seq_len": 8192,
                                            "memory": {"recompute": "per-layer", "offload_layer_inputs": True}}])
    assert len(rows) == 2 and not check(rows)


@pytest.mark.slow
def test_planner_matches_trainer_three_lengths_two_strategies(long_shards, tmp_path):
    cases = [{"seq_len": T, "memory": {"recompute": r}} for T in (4096, 8192, 16384) for r in ("none", "per-layer")]
    cases += [{"seq_len": 8192, "memory": {"recompute": "per-layer", "offload_layer_inputs": True}},
              {"seq_len": 8192, "memory": {"recompute": "selective", "recompute_layers": ["dsa", "moe"]}},
              {"seq_len": 8192, "memory": {"recompute": "none", "moe_recompute": True}}]
    # cases whose peak is an op's transient rather than saved activations
    cases += [{"seq_len": 16384, "memory": {"recompute": "per-layer", "dsa_block_queries": 4096}},  # DSA indexer
              {"seq_len": 16384,
               "memory": {"recompute": "per-layer", "moe_recompute": True, "moe_block_tokens": 16384}},
              {"seq_len": 8192, "memory": {"recompute": "per-layer", "loss_chunk_tokens": 8192},  # LM head chunk
               "model_overrides": {"vocab_size": 8192}},
              {"seq_len": 8192, "memory": {"recompute": "per-layer", "dsa_block_queries": 512},  # sparse attention
               "model_overrides": {"index_topk": 512, "kv_lora_rank": 128}}]
    rows = measure(long_shards, tmp_path, cases)
    assert len(rows) == len(cases)
    assert not check(rows)
