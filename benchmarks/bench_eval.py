"""Eval throughput: tokens/s of per-token scoring with `glm53-tiny`, parallel vs streaming engine.

One window of T synthetic-genome-like tokens (random A/C/G/T) is scored through the same code
path as `genome-lm eval` (`genome_lm.eval.scoring.score_window`, no gradients, whole window as
one piece). Each (engine, T) runs in its own subprocess so the peak-memory number (GPU: max
allocated; CPU: resident high-water mark VmHWM minus the resident size before scoring, with the
malloc mmap threshold fixed so that freed tensors leave the resident set) is its own. Next to it,
for the parallel engine, `planned`: what `genome-lm eval --dry-run` estimates for the same forward
(`genome_lm.plan.memory.plan_forward`, one process: its peak minus the weights).

    python benchmarks/bench_eval.py                         # T = 16k, 64k; both engines
    python benchmarks/bench_eval.py --T 16k --engines parallel --repeats 3

Writes benchmarks/results/bench_eval.json and prints a table. Not a test.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "bench_eval.json"


from genome_lm.train.metrics import proc_status_kb as _status_kb  # noqa: E402


def _measure(engine: str, T: int, repeats: int, chunk_tokens: int, device: str) -> dict:
    """Run in a child process: score one T-token window `repeats` times after a short warm-up."""
    import numpy as np
    import torch

    from genome_lm.eval.scoring import score_window
    from genome_lm.model import apply_long_context, build

    torch.manual_seed(0)
    model = build("glm53-tiny", device=device).model
    apply_long_context(model)
    model.eval()
    lut = np.arange(256, dtype=np.int64)
    tokens = np.random.default_rng(0).integers(0, 4, T).astype(np.uint8)
    run = lambda t: score_window(model, t, lut, 5, len(t), engine, chunk_tokens)  # noqa: E731
    run(tokens[:2048])  # warm-up: first-call initialisation, kernels
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    rss0 = (_status_kb("VmRSS") or 0) * 1024
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        nll = run(tokens)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else (_status_kb("VmHWM") or 0) * 1024 - rss0
    best = min(times)
    return {"engine": engine, "T": T, "device": device, "chunk_tokens": chunk_tokens if engine == "streaming" else None,
            "seconds": best, "seconds_all": times, "tokens_per_s": T / best, "peak_mem_bytes": int(peak),
            "planned_bytes": _planned(model, T, device) if engine == "parallel" else None,
            "mean_nll": float(np.nanmean(nll)), "threads": torch.get_num_threads()}


def _planned(model, T: int, device: str) -> int:
    """The dry run's estimate of the same forward's activations (peak minus weights), one process."""
    from genome_lm.plan.layout import Layout
    from genome_lm.plan.memory import plan_forward
    from genome_lm.plan.shapes import shape_of

    layout = Layout(T).replace(moe_recompute=True)  # the default block sizes, hyper-connections recomputed
    plan = plan_forward(shape_of(model, "glm53-tiny", "float32"), layout,
                        backend="fla" if device == "cuda" else "torch")
    return plan.peak_bytes - plan.weights_bytes


def main() -> None:
    from genome_lm.sizes import parse_size

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--T", nargs="+", default=["16k", "64k"], help="window lengths (tokens)")
    p.add_argument("--engines", nargs="+", default=["parallel", "streaming"], choices=["parallel", "streaming"])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--chunk-tokens", default="4k", help="streaming engine chunk")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        engine, T, repeats, chunk, device = args.child.split(":")
        print(json.dumps(_measure(engine, int(T), int(repeats), int(chunk), device)))
        return

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    chunk = parse_size(args.chunk_tokens)
    rows = []
    for T in (parse_size(t) for t in args.T):
        for engine in args.engines:
            cmd = [sys.executable, __file__, "--child", f"{engine}:{T}:{args.repeats}:{chunk}:{device}"]
            env = {**os.environ, "TQDM_DISABLE": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                rows.append({"engine": engine, "T": T, "device": device, "error": last})
            else:
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(rows[-1] if "error" in rows[-1]
                  else f"  {engine:>9} T={T:>7,}: {rows[-1]['tokens_per_s']:,.0f} tokens/s",
                  flush=True)

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"model": "glm53-tiny", "device": device, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                   "results": rows}, indent=2) + "\n")
    print(f"\n{'engine':>10} {'T':>8} {'seconds':>9} {'tokens/s':>10} {'peak MiB':>9} {'planned':>8} {'mean NLL':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['engine']:>10} {r['T']:>8,}  error: {r['error']}")
            continue
        planned = f"{r['planned_bytes'] / 2**20:>8.0f}" if r.get("planned_bytes") else f"{'':>8}"
        print(f"{r['engine']:>10} {r['T']:>8,} {r['seconds']:>9.2f} {r['tokens_per_s']:>10,.0f} "
              f"{r['peak_mem_bytes'] / 2**20:>9.0f} {planned} {r['mean_nll']:>9.4f}")
    print(f"-> {RESULTS}")


if __name__ == "__main__":
    main()
