"""Training step time and peak memory of glm53-tiny per memory strategy, side by side.

For each sequence length (default 8k, 32k, 64k) and strategy (recompute none, per-layer,
per-layer + layer-input offload), a fresh subprocess builds the model, applies the strategy
exactly as the trainer does (`genome_lm.train.parallelize`), runs `--warmup` + `--steps`
optimizer steps on random tokens and reports the median step time and the peak resident
set of the steps (VmHWM, reset before the first timed step). Writes
benchmarks/results/bench_train.json and prints a table with the overhead of each strategy
relative to `none` at the same length.

    python benchmarks/bench_train.py [--lengths 8k,32k,64k] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STRATEGIES = {
    "none": {"recompute": "none"},
    "per-layer": {"recompute": "per-layer"},
    "per-layer+offload": {"recompute": "per-layer", "offload_layer_inputs": True},
}

WORKER = r"""
import json, statistics, sys, time, torch
from genome_lm.config import MemoryConfig
from genome_lm.model import build
from genome_lm.train.metrics import PeakMemory
from genome_lm.train.parallelize import parallelize
T, strategy, steps, warmup = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
model = build("glm53-tiny").model
parallelize(model, MemoryConfig(**strategy))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 5, (1, T))
mem = PeakMemory(torch.device("cpu"))
times = []
for i in range(warmup + steps):
    if i == warmup:
        mem.reset()
    t0 = time.perf_counter()
    model(ids, labels=ids).loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    if i >= warmup:
        times.append(time.perf_counter() - t0)
print(json.dumps({"step_s": statistics.median(times), "peak_bytes": mem.peak(), "resettable": mem.resettable}))
"""


def main() -> None:
    from genome_lm.sizes import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="8k,32k,64k")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", default=str(HERE / "results" / "bench_train.json"))
    args = ap.parse_args()
    rows = []
    for length in args.lengths.split(","):
        T = parse_size(length)
        for name, strategy in STRATEGIES.items():
            res = subprocess.run([sys.executable, "-c", WORKER, str(T), json.dumps(strategy), str(args.steps),
                                  str(args.warmup)], capture_output=True, text=True, env=dict(os.environ))
            if res.returncode != 0:
                raise SystemExit(f"T={T} {name} failed:\n{res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append({"seq_len": T, "strategy": name, **r})
            print(f"  T={T:>7} {name:<18} {r['step_s']:.2f} s/step  peak {r['peak_bytes'] / 2**20:,.0f} MiB",
                  flush=True)
    for r in rows:
        base = next(b for b in rows if b["seq_len"] == r["seq_len"] and b["strategy"] == "none")
        r["time_vs_none"] = r["step_s"] / base["step_s"]
        r["peak_vs_none"] = r["peak_bytes"] / base["peak_bytes"]
        r["tokens_per_s"] = r["seq_len"] / r["step_s"]
    result = {"model": "glm53-tiny", "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"\n{'T':>7} {'strategy':<18} {'s/step':>8} {'tok/s':>8} {'peak MiB':>9} {'time/none':>10} {'peak/none':>10}")
    for r in rows:
        print(f"{r['seq_len']:>7} {r['strategy']:<18} {r['step_s']:>8.2f} {r['tokens_per_s']:>8.0f} "
              f"{r['peak_bytes'] / 2**20:>9,.0f} {r['time_vs_none']:>10.2f} {r['peak_vs_none']:>10.2f}")
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
