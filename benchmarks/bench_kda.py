"""KDA op alone on CPU: forward+backward time and peak memory at long T.

Compares `genome_lm.model.ops.kda.chunk_kda` with fla's `naive_recurrent_kda` (token loop) and
upstream transformers' torch fallback `chunk_kimi_delta_attention` (builds [.., C, C, K] decay
tensors). Each (implementation, T) runs in its own subprocess; peak memory is the process's
resident high-water mark (VmHWM, reset via /proc/self/clear_refs just before the op; falls
back to ru_maxrss) minus the resident size before the op, so it counts every allocator.

    python benchmarks/bench_kda.py                 # T = 1k, 4k, 16k (+ chunk at 64k)
    python benchmarks/bench_kda.py --T 1024 4096 --impl chunk naive

Writes benchmarks/results/bench_kda.json and prints a table. Not a test.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "bench_kda.json"
IMPLS = ["chunk", "naive", "upstream"]
# where the reference implementations stop being worth running (time / memory), tokens
MAX_T = {"chunk": 1 << 20, "naive": 16384, "upstream": 16384}


from genome_lm.train.metrics import proc_status_kb as _status_kb  # noqa: E402
from genome_lm.train.metrics import reset_rss_peak as _reset_peak


def _load(impl: str):
    if impl == "chunk":
        from genome_lm.model.ops.kda import chunk_kda

        return lambda q, k, v, g, b, h0: chunk_kda(q, k, v, g, b, initial_state=h0, output_final_state=True)
    if impl == "naive":
        from genome_lm.model.ops.kda._fla import load_fla_reference

        fn = load_fla_reference("ops/kda/naive.py", "naive_recurrent_kda")
        if fn is None:
            raise SystemExit("flash-linear-attention not installed")
        return lambda q, k, v, g, b, h0: fn(q, k, v, g, b, initial_state=h0, output_final_state=True)
    from transformers.models.glm5_next import modeling_glm5_next as upstream

    fn = upstream.chunk_kimi_delta_attention.__wrapped__  # the torch fallback itself
    return lambda q, k, v, g, b, h0: fn(q, k, v, g, b, initial_state=h0, output_final_state=True)


def worker(impl: str, T: int, B: int, H: int, K: int, repeats: int) -> dict:
    """One measurement, in this process: fwd and fwd+bwd seconds (best of `repeats`), peak MiB."""
    import torch

    fn = _load(impl)
    gen = torch.Generator().manual_seed(0)
    norm = torch.nn.functional.normalize
    q = norm(torch.randn(B, T, H, K, generator=gen), dim=-1).requires_grad_()
    k = norm(torch.randn(B, T, H, K, generator=gen), dim=-1).requires_grad_()
    v = torch.randn(B, T, H, K, generator=gen).requires_grad_()
    g = (-5 * torch.sigmoid(2 * torch.randn(B, T, H, K, generator=gen))).requires_grad_()
    beta = torch.rand(B, T, H, generator=gen).requires_grad_()
    h0 = torch.zeros(B, H, K, K).requires_grad_()
    do = torch.randn(B, T, H, K, generator=gen)

    fwd, total, peak_mb = [], [], None
    for rep in range(repeats):
        rss_before = _status_kb("VmRSS")
        reset = _reset_peak()
        t0 = time.perf_counter()
        o, S = fn(q, k, v, g, beta, h0)
        t1 = time.perf_counter()
        ((o * do).sum() + S.sum()).backward()
        t2 = time.perf_counter()
        hwm = _status_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if rep == 0 and hwm is not None and rss_before is not None:
            peak_mb = (hwm - rss_before) / 1024
        fwd.append(t1 - t0)
        total.append(t2 - t0)
        for x in (q, k, v, g, beta, h0):
            x.grad = None
        del o, S
    return {
        "impl": impl,
        "T": T,
        "B": B,
        "H": H,
        "K": K,
        "V": K,
        "threads": torch.get_num_threads(),
        "fwd_s": min(fwd),
        "fwd_bwd_s": min(total),
        "peak_extra_mib": peak_mb,
        "bytes_per_token": None if peak_mb is None else peak_mb * 2**20 / (B * T),
    }


def run_one(impl: str, T: int, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, str(T), "--B", str(args.B), "--H", str(args.H)]
    cmd += ["--K", str(args.K), "--threads", str(args.threads)]
    cmd += ["--repeats", str(1 if impl != "chunk" and T > 4096 else args.repeats)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "T": T, "skipped": f"timeout after {args.timeout} s"}
    if done.returncode != 0:
        return {"impl": impl, "T": T, "skipped": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = [f"{'impl':<9}{'T':>7}{'fwd s':>9}{'fwd+bwd s':>11}{'peak MiB':>10}{'B/token':>9}  note"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['impl']:<9}{r['T']:>7}{'':>39}  {r['skipped']}")
            continue
        lines.append(
            f"{r['impl']:<9}{r['T']:>7}{r['fwd_s']:>9.3f}{r['fwd_bwd_s']:>11.3f}"
            f"{r['peak_extra_mib']:>10.1f}{r['bytes_per_token']:>9.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--impl", nargs="+", default=IMPLS, choices=IMPLS)
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--K", type=int, default=32, help="head dim (K = V)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--worker", nargs=2, metavar=("IMPL", "T"), help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        impl, T = args.worker[0], int(args.worker[1])
        print(json.dumps(worker(impl, T, args.B, args.H, args.K, args.repeats)))
        return

    rows = []
    for T in args.T:
        for impl in args.impl:
            if T > MAX_T[impl]:
                rows.append({"impl": impl, "T": T, "skipped": f"not run above T={MAX_T[impl]}"})
                continue
            rows.append(run_one(impl, T, args))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": vars(args) | {"out": str(args.out)}, "results": rows}, indent=2))
    tmp.replace(args.out)
    print(table(rows))


if __name__ == "__main__":
    main()
