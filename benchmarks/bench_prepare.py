"""Throughput and peak memory of `genome-lm prepare` vs a naive baseline, side by side.

Generates a chr1-sized FASTA (default 250 Mbp, 60-column lines, soft-masked stretches and N
runs), gzips a copy, then runs in separate subprocesses (so each peak RSS is its own):
  - prepare on the plain FASTA,
  - prepare on the gzip FASTA,
  - a naive baseline: pyfaidx slices -> Python strings -> per-window tokenisation
    (a dict lookup per base, as a first script would do), on plain and on gzip (bgzip) input.
Writes benchmarks/results/bench_prepare.json and prints a table.

    python benchmarks/bench_prepare.py [--mbp 250] [--seq-len 1M] [--naive-mbp 25]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def make_fasta(path: Path, mbp: float, seed: int = 0) -> int:
    """Random chr1-like FASTA: 60-column lines, ~50% lowercase in blocks, N runs at the ends and middle."""
    n = int(mbp * 1e6)
    rng = np.random.default_rng(seed)
    seq = np.frombuffer(b"ACGT", np.uint8)[rng.integers(0, 4, n, dtype=np.uint8)].copy()
    block = 5000
    lower = np.repeat(rng.random(n // block + 1) < 0.5, block)[:n]
    seq[lower] += 32
    for s, e in ((0, 10_000), (n // 2, n // 2 + 3_000_000), (n - 10_000, n)):
        seq[s:e] = ord("N")
    lines = seq[: n - n % 60].reshape(-1, 60)
    body = np.concatenate([lines, np.full((len(lines), 1), ord("\n"), np.uint8)], axis=1).tobytes()
    tail = seq[n - n % 60 :].tobytes()
    with open(path, "wb") as f:
        f.write(b">chr1 synthetic benchmark chromosome\n")
        f.write(body)
        if tail:
            f.write(tail + b"\n")
    return path.stat().st_size


WORKER = r"""
import json, sys, time
mode, fasta, out, seq_len = sys.argv[1:5]
t0, c0 = time.perf_counter(), time.process_time()
if mode == "imports":  # the interpreter and libraries alone: the constant part of every peak
    import genome_lm.genome.prepare  # noqa: F401
elif mode == "prepare":
    from genome_lm.genome.prepare import PrepareParams, prepare
    params = PrepareParams.from_cli(fasta=[fasta], train_chroms="chr1", eval_chroms="", seq_len=seq_len, min_len="1")
    prepare(params, out, overwrite=True, show_progress=False)
else:  # naive: pyfaidx slices -> str -> per-base dict lookups -> one row per window
    import numpy as np, pyfaidx, pyarrow as pa, pyarrow.parquet as pq
    vocab = {"A": 0, "C": 1, "G": 2, "T": 3, "N": 4}
    L = int(seq_len)
    fa = pyfaidx.Fasta(fasta)
    rows = []
    for name in fa.keys():
        rec = fa[name]
        for s in range(0, len(rec), L):
            seq = str(rec[s : s + L]).upper()
            tokens = np.array([vocab.get(c, 4) for c in seq], dtype=np.uint8)
            rows.append({"chrom": name, "start": s, "end": s + len(seq), "tokens": tokens.tolist()})
    pq.write_table(pa.Table.from_pylist(rows), out + ".parquet")
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
# VmHWM, not ru_maxrss: ru_maxrss survives exec and would report the parent's peak.
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": elapsed, "cpu_seconds": cpu, "max_rss_bytes": hwm}))
"""


def run(mode: str, fasta: Path, out: Path, seq_len: int) -> dict:
    env = dict(os.environ, TQDM_DISABLE="1")
    res = subprocess.run([sys.executable, "-c", WORKER, mode, str(fasta), str(out), str(seq_len)],
                         capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{mode} on {fasta} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mbp", type=float, default=250.0, help="chromosome size in Mbp (chr1: 249)")
    ap.add_argument("--naive-mbp", type=float, default=50.0, help="size for the (slow) naive baseline")
    ap.add_argument("--seq-len", type=int, default=1 << 20)
    ap.add_argument("--json", default=str(HERE / "results" / "bench_prepare.json"))
    args = ap.parse_args()

    from genome_lm.genome.prepare import PrepareParams  # noqa: F401  (fail early if not installed)

    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        tmp = Path(tmp)
        plain = tmp / "chr1.fa"
        size = make_fasta(plain, args.mbp)
        gz = tmp / "chr1.fa.gz"
        with open(plain, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
            while chunk := src.read(1 << 24):
                dst.write(chunk)
        small = tmp / "small.fa"
        small_size = make_fasta(small, args.naive_mbp, seed=1)
        cases = [
            ("genome_lm prepare", "plain", "prepare", plain, size),
            ("genome_lm prepare", "gzip", "prepare", gz, size),
            ("genome_lm prepare", f"plain {args.naive_mbp:g} Mbp", "prepare", small, small_size),
            ("naive baseline", f"plain {args.naive_mbp:g} Mbp", "naive", small, small_size),
        ]
        baseline = run("imports", plain, tmp / "none", args.seq_len)["max_rss_bytes"]
        rows = []
        for name, input_kind, mode, path, fasta_bytes in cases:
            (tmp / "fai").unlink(missing_ok=True)
            r = run(mode, path, tmp / f"out_{mode}", args.seq_len)
            rows.append({
                "impl": name, "input": input_kind, "fasta_bytes": fasta_bytes, "seconds": r["seconds"],
                "cpu_seconds": r["cpu_seconds"], "mb_per_s": fasta_bytes / 1e6 / r["seconds"],
                "mb_per_cpu_s": fasta_bytes / 1e6 / r["cpu_seconds"], "max_rss_bytes": r["max_rss_bytes"],
                "rss_over_chrom": r["max_rss_bytes"] / fasta_bytes,
                "rss_above_imports_over_chrom": (r["max_rss_bytes"] - baseline) / fasta_bytes,
            })
            for p in (tmp / f"out_{mode}",):
                subprocess.run(["rm", "-rf", str(p)])
            for f in tmp.glob("*.fai"):
                f.unlink()
    speedup = rows[2]["mb_per_s"] / rows[3]["mb_per_s"]
    speedup_cpu = rows[2]["mb_per_cpu_s"] / rows[3]["mb_per_cpu_s"]
    result = {"import_baseline_rss_bytes": baseline, "mbp": args.mbp, "seq_len": args.seq_len, "cpus": os.cpu_count(),
              "rows": rows,
              "speedup_vs_naive_same_input": speedup, "speedup_vs_naive_cpu_time": speedup_cpu,
              "load_average_before": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"{'implementation':<20} {'input':<16} {'MB':>8} {'wall s':>7} {'MB/s':>8} {'CPU s':>7} {'MB/CPU-s':>9} "
          f"{'peak RSS MB':>12} {'RSS/FASTA':>10} {'(RSS-imports)/FASTA':>20}")
    for r in rows:
        print(f"{r['impl']:<20} {r['input']:<16} {r['fasta_bytes'] / 1e6:>8.1f} {r['seconds']:>7.2f} "
              f"{r['mb_per_s']:>8.1f} {r['cpu_seconds']:>7.2f} {r['mb_per_cpu_s']:>9.1f} "
              f"{r['max_rss_bytes'] / 1e6:>12.0f} {r['rss_over_chrom']:>10.2f} "
              f"{r['rss_above_imports_over_chrom']:>20.2f}")
    print(f"interpreter + imports alone: {baseline / 1e6:.0f} MB peak RSS")
    print(f"speed-up over the naive baseline on the same input: {speedup:.1f}x wall, {speedup_cpu:.1f}x CPU time; "
          f"load average before the run {os.getloadavg()[0]:.1f}  ->  {args.json}")


if __name__ == "__main__":
    main()
