"""Context parallelism on one machine: step time and peak memory per rank, CP = 1 vs CP = 2.

Two processes (gloo on CPU, nccl on GPU) train glm53-tiny on random tokens exactly as the
trainer does (`init_parallel` -> `parallelize`: long-context ops, CP, recompute, FSDP2 -> AdamW):
  - cp 1 (dp 2): each rank holds a whole T-token sequence (two sequences per step);
  - cp 2 (dp 1): one T-token sequence split into two slabs of T/2.
For each length (default 32k, 64k) and layout: median step time of `--steps` optimizer steps
after `--warmup`, and per rank the resident set before the first step (model, optimizer,
libraries: VmRSS) and its peak during the timed steps (VmHWM, reset before them; on GPU:
allocated / peak allocated device memory). The step's part (peak - before) should roughly halve
with CP 2. The resident set also holds allocator caches and transients, so the exact measure of
what CP divides is given too: the bytes autograd saves for backward in one forward (unique
storages, counted with saved-tensor hooks in the first warm-up step).
Writes benchmarks/results/bench_parallel.json and prints a table.

    python benchmarks/bench_parallel.py [--lengths 32k,64k] [--steps 1] [--warmup 1] [--recompute none]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from genome_lm.parallel.launch import free_port

HERE = Path(__file__).resolve().parent


def _worker(rank: int, world: int, port: int, T: int, cp: int, steps: int, warmup: int, recompute: str,
            out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    from genome_lm.config import MemoryConfig, ParallelConfig
    from genome_lm.model import build
    from genome_lm.parallel import clip_grad_norm_
    from genome_lm.parallel.mesh import init_parallel
    from genome_lm.train.metrics import PeakMemory
    from genome_lm.train.parallelize import parallelize

    par = init_parallel(ParallelConfig(cp=cp, dp="auto"))
    torch.manual_seed(0)
    model = build("glm53-tiny", device=par.device).model
    parallelize(model, MemoryConfig(recompute=recompute), par)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    gen = torch.Generator().manual_seed(1000 + par.dp_rank)  # one sequence per replica
    mem = PeakMemory(par.device)
    times, saved = [], {}
    before = torch.cuda.memory_allocated() if par.device.type == "cuda" else rss_now()
    for i in range(warmup + steps):
        ids = torch.randint(0, 5, (1, T), generator=gen).to(par.device)
        if i == warmup:
            if par.device.type == "cuda":
                torch.cuda.synchronize()
            else:
                release_free_heap()  # so that the warm-up's freed memory does not count as resident
            mem.reset()
        par.barrier()
        t0 = time.perf_counter()
        with saved_bytes_counter(saved) if i == 0 else contextlib.nullcontext():
            loss = model(ids, labels=ids).loss
        loss.backward()
        float(clip_grad_norm_(params, 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        if par.device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(par.max_all(time.perf_counter() - t0))
    result = {"rank": rank, "step_s": statistics.median(times), "before_bytes": before, "peak_bytes": mem.peak(),
              "saved_activation_bytes": sum(saved.values()),
              "loss": float(loss.detach()), "resettable": mem.resettable, "device": str(par.device)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    par.shutdown()


@contextlib.contextmanager
def saved_bytes_counter(seen: dict):
    """Record {storage: bytes} of every tensor autograd saves for backward inside the block."""

    def pack(t):
        try:
            storage = t.untyped_storage()
            seen[(storage.data_ptr(), t.device)] = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def release_free_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_layout(T: int, cp: int, steps: int, warmup: int, recompute: str, world: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(world, free_port(), T, cp, steps, warmup, recompute, out), nprocs=world,
                           start_method="spawn")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    dp = world // cp
    step = max(r["step_s"] for r in ranks)
    return {
        "T": T, "cp": cp, "dp": dp, "world": world, "recompute": recompute, "tokens_per_rank": T // cp,
        "step_s": step, "tokens_per_s": dp * T / step,
        "peak_bytes_per_rank": max(r["peak_bytes"] for r in ranks),
        "before_bytes_per_rank": max(r["before_bytes"] for r in ranks),
        "step_peak_bytes_per_rank": max(r["peak_bytes"] - r["before_bytes"] for r in ranks),
        "saved_activation_bytes_per_rank": max(r["saved_activation_bytes"] for r in ranks),
        "ranks": ranks,
    }


def table(rows: list[dict]) -> str:
    gib = 2**30
    lines = [f"{'T':>7} {'cp':>3} {'dp':>3} {'tok/rank':>9} {'step s':>8} {'tok/s':>8} {'peak GiB/rank':>14} "
             f"{'step part GiB':>14} {'vs cp1':>7} {'saved GiB/rank':>15} {'vs cp1':>7}"]
    base = {r["T"]: r for r in rows if r["cp"] == 1}
    for r in rows:
        ref = base.get(r["T"])
        ratio = r["step_peak_bytes_per_rank"] / ref["step_peak_bytes_per_rank"] if ref else float("nan")
        saved = r["saved_activation_bytes_per_rank"] / ref["saved_activation_bytes_per_rank"] if ref else float("nan")
        lines.append(f"{r['T']:>7,} {r['cp']:>3} {r['dp']:>3} {r['tokens_per_rank']:>9,} {r['step_s']:>8.2f} "
                     f"{r['tokens_per_s']:>8.0f} {r['peak_bytes_per_rank'] / gib:>14.3f} "
                     f"{r['step_peak_bytes_per_rank'] / gib:>14.3f} {ratio:>7.2f} "
                     f"{r['saved_activation_bytes_per_rank'] / gib:>15.3f} {saved:>7.2f}")
    return "\n".join(lines)


def main() -> None:
    from genome_lm.sizes import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="32k,64k")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--recompute", default="none", choices=["none", "per-layer"])
    ap.add_argument("--out", default=str(HERE / "results" / "bench_parallel.json"))
    args = ap.parse_args()
    rows = []
    for T in [parse_size(x) for x in args.lengths.split(",")]:
        for cp in (1, 2):
            t0 = time.time()
            rows.append(run_layout(T, cp, args.steps, args.warmup, args.recompute))
            print(f"T={T:,} cp={cp}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    result = {
        "benchmark": "bench_parallel", "model": "glm53-tiny", "processes": 2, "steps": args.steps,
        "warmup": args.warmup, "recompute": args.recompute, "torch": torch.__version__,
        "cpu_count": os.cpu_count(), "cuda": torch.cuda.is_available(), "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
