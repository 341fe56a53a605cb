"""Run the real trainer on glm53-tiny for several (sequence length, strategy) cases, one step each,
and print, per case, the peak memory it logged and the process baseline before the step.

    python tests/plan/calibrate_worker.py SHARDS OUT_DIR CASES_JSON

CASES_JSON: [{"seq_len": 8192, "memory": {"recompute": "none"}, "model_overrides": {}}, ...]. Prints
one JSON line per case: {"seq_len", "memory", "model_overrides", "peak_mem_bytes", "baseline_bytes",
"step_time_s"}.

The baseline is the process's resident set at the moment the trainer resets its peak counter
(`PeakMemory.reset`, right before the step): interpreter, torch, the model and its optimizer.
Run it with MALLOC_MMAP_THRESHOLD_ fixed (the test does) so that freed tensors go back to the OS
and the resident set follows live tensors, as `torch.cuda.max_memory_allocated` does on a GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    shards, out, cases = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    import torch

    import genome_lm.train.metrics as metrics
    from genome_lm.config import parse_experiment
    from genome_lm.train import train

    torch.set_num_threads(1)
    baselines: list[int] = []
    reset = metrics.PeakMemory.reset

    def reset_and_record(self):
        reset(self)
        baselines.append(rss_now())

    metrics.PeakMemory.reset = reset_and_record
    # warm-up (not reported): one-time allocations of the first step (kernel libraries, lazy
    # imports, thread pools) then belong to the baseline instead of to the first measured case
    warm = {"seq_len": 1024, "memory": {"recompute": "per-layer", "moe_recompute": True}, "warmup": True}
    for i, case in enumerate([warm] + cases):
        cfg = parse_experiment({
            "name": f"calib{i}",
            "data": {"shards": shards, "seq_len": case["seq_len"], "seed": 0, "reverse_complement": False},
            "model": {"name": "glm53-tiny", "overrides": case.get("model_overrides", {})},
            "train": {"steps": 1, "micro_batch": 1, "lr": 1e-4, "checkpoint_every": 1000, "keep_checkpoints": 1},
            "memory": case["memory"],
            "log": {"wandb": "disabled"},
        })
        baselines.clear()
        record = train(cfg, out=out / f"case{i}", show_progress=False)
        if case.get("warmup"):
            continue
        line = json.loads((out / f"case{i}" / "metrics.jsonl").read_text().splitlines()[0])
        print(json.dumps({"seq_len": case["seq_len"], "memory": case["memory"], "tokens": record["tokens"],
                          "model_overrides": case.get("model_overrides", {}),
                          "peak_mem_bytes": line["peak_mem_bytes"], "baseline_bytes": baselines[0],
                          "step_time_s": line["step_time_s"]}), flush=True)


if __name__ == "__main__":
    main()
