"""glm53-tiny forward+backward: unpatched upstream vs `apply_long_context`, time and memory vs T.

Each (implementation, T) runs in a fresh subprocess: build the model (seeded), one warm-up
fwd+bwd at 256 tokens, then fwd+bwd (loss = mean next-token NLL over all T tokens) at T.
Peak memory is the process's resident high-water mark (VmHWM, reset through /proc/self/clear_refs
right before the measured step) minus the resident size before it, so every allocation the step
makes counts (activations, saved tensors, gradients, allocator slack), not the model or torch.
Memory is taken from the first measured step; time is the best of `--repeats` steps, as wall
clock and as process CPU time (one thread: CPU time is what the step costs, unaffected by other
processes competing for the cores; the targets use it, the table shows both).

    impl       what runs
    upstream   unpatched transformers glm5_next with its own torch fallbacks (dense [T, T] DSA
               masks, [.., C, C, K] KDA decay tensors, MoE over all tokens, full logits)
    patched    `apply_long_context(model)`: every op (KDA, DSA, MoE, HC, loss), default sizes
    recompute  patched + per-layer recompute (`genome_lm.train.parallelize.recompute` on
               every decoder layer), what `genome-lm train` runs at long T

    python benchmarks/bench_model.py                     # upstream 1k-4k, patched 1k-128k
    python benchmarks/bench_model.py --T 8192 65536 --impl patched recompute

Targets: patched >= 5x faster than upstream at 4k; patched time per token at 64k within
2x of 8k; patched peak memory per token flat within +-30% from 8k to 128k. The KDA op alone
(chunk_kda vs fla's naive_recurrent_kda) is read from `results/bench_kda.json`
(`benchmarks/bench_kda.py`). Writes benchmarks/results/bench_model.json and prints a table.
One thread by default (this machine's cores are shared). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "bench_model.json"
KDA_RESULTS = ROOT / "results" / "bench_kda.json"
IMPLS = ["upstream", "patched", "recompute"]
DEFAULT_T = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
# upstream beyond 4k: ~2 GB and ~15 s at 4k, quadratic in both; not run above this
MAX_T = {"upstream": 4096, "patched": 1 << 20, "recompute": 1 << 20}
WARMUP_T = 256


from genome_lm.train.metrics import proc_status_kb as _status_kb  # noqa: E402
from genome_lm.train.metrics import reset_rss_peak as _reset_peak


def _mem_available() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def build_model(impl: str, seed: int = 0):
    import torch

    from genome_lm.model import apply_long_context, build

    torch.manual_seed(seed)
    model = build("glm53-tiny").model
    if impl in ("patched", "recompute"):
        apply_long_context(model)
    if impl == "recompute":
        from genome_lm.train.parallelize import recompute

        for layer in model.model.layers:
            recompute(layer)
    return model.train()


def worker(impl: str, T: int, repeats: int) -> dict:
    """One measurement in this process: fwd and fwd+bwd seconds (best of `repeats`), peak bytes."""
    import contextlib

    import torch

    from genome_lm.model import use_torch_fallbacks

    model = build_model(impl)
    layers = model.config.num_hidden_layers
    ctx = use_torch_fallbacks() if impl == "upstream" else contextlib.nullcontext()
    gen = torch.Generator().manual_seed(T)

    def step(n: int) -> tuple[float, float, float, float]:
        x = torch.randint(0, model.config.vocab_size, (1, n), generator=gen)
        c0, t0 = time.process_time(), time.perf_counter()
        loss = model(x, labels=x).loss
        t1 = time.perf_counter()
        loss.backward()
        c2, t2 = time.process_time(), time.perf_counter()
        model.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t0, c2 - c0, loss.item()

    with ctx:
        step(min(WARMUP_T, T))
        fwd, total, cpu, peak = [], [], [], None
        for rep in range(repeats):
            rss_before = _status_kb("VmRSS")
            reset = _reset_peak()
            f, t, c, loss = step(T)
            if rep == 0 and reset and rss_before is not None:
                peak = (_status_kb("VmHWM") - rss_before) * 1024
            fwd.append(f)
            total.append(t)
            cpu.append(c)
    best = min(total)
    return {
        "impl": impl,
        "T": T,
        "layers": layers,
        "threads": torch.get_num_threads(),
        "fwd_s": min(fwd),
        "fwd_bwd_s": best,
        "us_per_token": best / T * 1e6,
        "cpu_s": min(cpu),
        "cpu_us_per_token": min(cpu) / T * 1e6,
        "peak_bytes": peak,
        "bytes_per_token": None if peak is None else peak / T,
        "bytes_per_token_per_layer": None if peak is None else peak / T / layers,
        "loss": loss,
        "repeats": repeats,
    }


def run_one(impl: str, T: int, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, str(T), "--threads", str(args.threads)]
    cmd += ["--repeats", str(args.repeats if T <= args.repeat_max_t else 1)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "T": T, "skipped": f"timeout after {args.timeout:.0f} s"}
    if done.returncode != 0:
        return {"impl": impl, "T": T, "skipped": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["wall_s"] = time.perf_counter() - t0
    return row


def memory_guard(impl: str, T: int, rows: list[dict], fraction: float) -> str | None:
    """A reason to skip when the predicted peak (bytes/token at the longest T run so far x T x 1.3)
    would take more than `fraction` of the memory available now; None to go ahead."""
    seen = [(r["T"], r["bytes_per_token"]) for r in rows if r.get("impl") == impl and r.get("bytes_per_token")]
    avail = _mem_available()
    if not seen or avail is None:
        return None
    need = max(seen)[1] * T * 1.3
    if need > fraction * avail:
        return f"predicted {need / 2**30:.1f} GiB > {fraction:.0%} of {avail / 2**30:.1f} GiB available"
    return None


def kda_summary() -> list[dict]:
    """chunk_kda vs naive_recurrent_kda (and upstream's fallback) from bench_kda.json."""
    if not KDA_RESULTS.exists():
        return []
    rows = json.loads(KDA_RESULTS.read_text())["results"]
    by = {(r["impl"], r["T"]): r for r in rows if "skipped" not in r}
    out = []
    for T in sorted({T for _, T in by}):
        chunk, naive, up = by.get(("chunk", T)), by.get(("naive", T)), by.get(("upstream", T))
        if chunk is None:
            continue
        out.append({
            "T": T,
            "chunk_fwd_bwd_s": chunk["fwd_bwd_s"],
            "naive_fwd_bwd_s": naive and naive["fwd_bwd_s"],
            "upstream_fwd_bwd_s": up and up["fwd_bwd_s"],
            "speedup_vs_naive": naive and naive["fwd_bwd_s"] / chunk["fwd_bwd_s"],
            "chunk_bytes_per_token": chunk["bytes_per_token"],
            "naive_bytes_per_token": naive and naive["bytes_per_token"],
        })
    return out


def targets(rows: list[dict]) -> dict:
    by = {(r["impl"], r["T"]): r for r in rows if "skipped" not in r}
    out = {}
    # CPU time of the (single-threaded) step decides: wall time on a shared machine also counts
    # other processes; both are recorded
    up, pa = by.get(("upstream", 4096)), by.get(("patched", 4096))
    if up and pa:
        s = up["cpu_s"] / pa["cpu_s"]
        out["speedup_at_4k"] = {"value": s, "wall_value": up["fwd_bwd_s"] / pa["fwd_bwd_s"],
                                "target": ">= 5", "met": s >= 5}
    a, b = by.get(("patched", 8192)), by.get(("patched", 65536))
    if a and b:
        r = b["cpu_us_per_token"] / a["cpu_us_per_token"]
        out["time_per_token_64k_over_8k"] = {"value": r, "wall_value": b["us_per_token"] / a["us_per_token"],
                                             "target": "<= 2", "met": r <= 2}
    mem = [by[("patched", T)]["bytes_per_token"] for T in DEFAULT_T
           if T >= 8192 and ("patched", T) in by and by[("patched", T)]["bytes_per_token"]]
    if len(mem) >= 2:
        ref = mem[0]
        dev = max(abs(m / ref - 1) for m in mem)
        top = max(T for (i, T) in by if i == "patched")
        out["memory_per_token_flat_8k_to_max"] = {
            "value": dev, "max_T": top, "target": "within +-30% of 8k up to 128k",
            "met": dev <= 0.30 and top >= 131072,
        }
    return out


def table(rows: list[dict]) -> str:
    lines = [f"{'impl':<10}{'T':>8}{'fwd s':>9}{'fwd+bwd s':>11}{'us/token':>10}{'cpu us/tok':>11}"
             f"{'peak MiB':>10}{'B/token':>9}{'B/tok/layer':>12}  note"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['impl']:<10}{r['T']:>8}{'':>72}  {r['skipped']}")
            continue
        peak = r["peak_bytes"]
        mib = f"{peak / 2**20:10.0f}" if peak else f"{'?':>10}"
        bpt = f"{r['bytes_per_token']:9.0f}{r['bytes_per_token_per_layer']:12.0f}" if peak else f"{'?':>21}"
        lines.append(f"{r['impl']:<10}{r['T']:>8}{r['fwd_s']:>9.2f}{r['fwd_bwd_s']:>11.2f}"
                     f"{r['us_per_token']:>10.0f}{r['cpu_us_per_token']:>11.0f}{mib}{bpt}")
    return "\n".join(lines)


def kda_table(rows: list[dict]) -> str:
    def f(x, fmt):
        return format(x, fmt) if x is not None else "-"

    lines = [f"{'KDA op T':>9}{'chunk s':>9}{'naive s':>9}{'speedup':>9}{'chunk B/tok':>12}{'naive B/tok':>12}"]
    for r in rows:
        lines.append(f"{r['T']:>9}{r['chunk_fwd_bwd_s']:>9.3f}{f(r['naive_fwd_bwd_s'], '9.3f'):>9}"
                     f"{f(r['speedup_vs_naive'], '9.1f'):>9}{r['chunk_bytes_per_token']:>12.0f}"
                     f"{f(r['naive_bytes_per_token'], '12.0f'):>12}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, nargs="+", default=DEFAULT_T)
    p.add_argument("--impl", nargs="+", default=["upstream", "patched"], choices=IMPLS)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="timed steps per config (best counts)")
    p.add_argument("--repeat-max-t", type=int, default=65536, help="above this T, one step only")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--mem-fraction", type=float, default=0.7, help="skip configs predicted to need more")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--worker", nargs=2, metavar=("IMPL", "T"), help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.repeats)))
        return

    rows = []
    for T in args.T:
        for impl in args.impl:
            if T > MAX_T[impl]:
                rows.append({"impl": impl, "T": T, "skipped": f"not run above T={MAX_T[impl]} (quadratic)"})
                continue
            if reason := memory_guard(impl, T, rows, args.mem_fraction):
                rows.append({"impl": impl, "T": T, "skipped": reason})
            else:
                rows.append(run_one(impl, T, args))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    kda = kda_summary()
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": "glm53-tiny",
        "command": "python benchmarks/bench_model.py " + " ".join(sys.argv[1:]),
        "results": rows,
        "targets": targets(rows),
        "kda_op": kda,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)
    print(table(rows))
    if kda:
        print("\n" + kda_table(kda) + f"\n(from {KDA_RESULTS.relative_to(ROOT.parent)})")
    print("\ntargets:")
    for name, t in result["targets"].items():
        wall = f", wall clock {t['wall_value']:.2f}" if "wall_value" in t else ""
        print(f"  {name}: {t['value']:.2f}{wall} (target {t['target']}) {'met' if t['met'] else 'MISSED'}")


if __name__ == "__main__":
    main()
