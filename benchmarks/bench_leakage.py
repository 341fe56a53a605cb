"""Throughput and peak memory of the leakage mask (`genome-lm prepare --leakage-k`, genome/leakage.py).

Synthetic input, made one chromosome at a time as prepare holds it (uint8 codes: random bases,
~50% soft-masked in 5 kbp blocks, N runs at the ends and in the middle): training chromosomes of
hg38's chr1 size, or chr1 + chr2 (~491 Mbp, the memory bound: <= 6 GB), and a chr22-sized eval
chromosome (50.8 Mbp) into which ~5% of segments of the training chromosomes are planted (1-10
kbp, every other one reverse-complemented, every third with a substitution every 100 bases), so
the mask has a known answer: the planted bases that exact K-mers cover must be marked, and
random sequence farther than K from them must not (a chance 32-mer match is ~1e-19 per pair).

Cases, each in its own process so that its peak RSS (VmHWM) is its own:
  - index, chr1-sized training input: `KmerIndex` build (add + sort) and the eval query;
  - index, chr1 + chr2;
  - `prepare` end to end on a plain FASTA of chr1 + chr2 + chr22 (1M windows), with and without
    `--leakage-k` (`--no-prepare` skips it; it writes ~1.6 GB to a temporary directory).
Writes benchmarks/results/bench_leakage.json and prints a table.

    python benchmarks/bench_leakage.py [--k 32] [--scale 1.0] [--no-prepare]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CHR1, CHR2, CHR22 = 248_956_422, 242_193_529, 50_818_468
LIMIT_BYTES = 6 * 10**9  # the bound: chr1 + chr2 against chr22 in <= 6 GB
PLANTED = 0.05  # share of the eval chromosome copied from the training ones


def chromosome(rng: np.random.Generator, n: int) -> np.ndarray:
    """prepare's codes [n] uint8 of a random chromosome: soft-masked 5 kbp blocks, N runs."""
    from genome_lm.genome.tokenizer import N_ID, SOFTMASK_BIT

    codes = rng.integers(0, 4, n, dtype=np.uint8)
    codes |= np.repeat((rng.random(n // 5000 + 1) < 0.5).astype(np.uint8) * SOFTMASK_BIT, 5000)[:n]
    for s, e in ((0, 10_000), (n // 2, n // 2 + min(3_000_000, n // 10)), (n - 10_000, n)):
        codes[s:e] = N_ID
    return codes


class Genome:
    """The training chromosomes (made on demand, one at a time) and the eval chromosome with
    segments of them planted at `at` (0-based starts, forward strand)."""

    def __init__(self, train_lens: list[int], eval_len: int, seed: int = 0):
        self.train_lens, self.eval_len = train_lens, eval_len
        rng = np.random.default_rng([seed, 1])
        n_seg = max(1, int(PLANTED * eval_len / 5500)) // len(train_lens) * len(train_lens)
        self.lengths = rng.integers(1000, 10_001, n_seg)
        self.at = 20_000 + (eval_len - 40_000) // n_seg * np.arange(n_seg)
        self.source = [int(rng.integers(20_000, train_lens[j % len(train_lens)] // 2 - 20_000)) for j in range(n_seg)]
        self.seed = seed
        self.segments: dict[int, np.ndarray] = {}

    def train(self, c: int) -> np.ndarray:
        """Training chromosome c; remembers the segments it gives to the eval chromosome."""
        codes = chromosome(np.random.default_rng([self.seed, 2, c]), self.train_lens[c])
        for j in range(c, len(self.lengths), len(self.train_lens)):
            self.segments[j] = codes[self.source[j] : self.source[j] + self.lengths[j]] & 7
        return codes

    def planted(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """bool [eval_len] masks: planted bases, and bases within K of one."""
        planted = np.zeros(self.eval_len, dtype=bool)
        near = np.zeros(self.eval_len, dtype=bool)
        for a, n in zip(self.at, self.lengths):
            planted[a : a + n] = True
            near[max(0, a - k + 1) : a + n + k - 1] = True
        return planted, near

    def eval(self) -> np.ndarray:
        from genome_lm.genome.tokenizer import reverse_complement

        codes = chromosome(np.random.default_rng([self.seed, 3]), self.eval_len)
        for j, a in enumerate(self.at):
            s = self.segments[j] if j % 2 == 0 else reverse_complement(self.segments[j])
            if j % 3 == 2:  # a substitution every 100 bases: no 100-mer survives, most 32-mers do
                s = s.copy()
                s[50::100] = (s[50::100] + 1) % 4
            codes[a : a + len(s)] = s
        return codes


def hwm() -> int:
    """Peak RSS of this process (VmHWM, not ru_maxrss: that survives exec and reports the parent's)."""
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM"))


def worker_index(k: int, train_lens: list[int], eval_len: int) -> dict:
    from genome_lm.genome.leakage import KmerIndex

    t_start, rss_before = time.perf_counter(), hwm()
    g = Genome(train_lens, eval_len)
    planted, near = g.planted(k)  # the answer, made before the index (not prepare's memory)
    index, t_add = KmerIndex(k, show_progress=False), 0.0
    for c in range(len(train_lens)):
        codes = g.train(c)
        t0 = time.perf_counter()
        index.add(codes, f"train{c}")
        t_add += time.perf_counter() - t0
        del codes
    t0 = time.perf_counter()
    index.finalize()
    t_sort = time.perf_counter() - t0
    rss_built = hwm()
    ev = g.eval()
    t0 = time.perf_counter()
    mask = index.mask(ev, "eval")
    t_query = time.perf_counter() - t0
    return {
        "kmers_added": index.added, "kmers_distinct": len(index.codes), "index_bytes": index.codes.nbytes,
        "add_seconds": t_add, "sort_seconds": t_sort, "build_seconds": t_add + t_sort, "query_seconds": t_query,
        "seconds": time.perf_counter() - t_start,
        "masked_fraction": float(mask.mean()), "planted_fraction": float(planted.mean()),
        "planted_marked": float(mask[planted].mean()),
        # a planted segment's K-mers can run past its ends by chance (the next base equals its
        # source's neighbour: 1/4, 1/16, ...); farther than K from every segment nothing may be marked
        "marked_next_to_planted": int((mask & ~planted).sum()), "marked_far_from_planted": int((mask & ~near).sum()),
        "rss_before_bytes": rss_before, "rss_after_build_bytes": rss_built, "max_rss_bytes": hwm(),
    }


def worker_prepare(k: int, fasta: str, out: str) -> dict:
    from genome_lm.genome.prepare import PrepareParams, prepare

    t0 = time.perf_counter()
    params = PrepareParams.from_cli(fasta=[fasta], train_chroms="chr1,chr2", eval_chroms="chr22", seq_len="1M",
                                    min_len="1", leakage_k=k)
    manifest = prepare(params, out, overwrite=True, show_progress=False)
    leak = manifest.get("leakage_mask", {})
    return {"seconds": time.perf_counter() - t0, "max_rss_bytes": hwm(),
            "masked_fraction": leak.get("fraction"), "kmers_distinct": leak.get("train_kmers_distinct")}


def write_fasta(path: Path, g: Genome) -> int:
    from genome_lm.genome.tokenizer import SOFTMASK_BIT

    letters = np.frombuffer(b"ACGTN", dtype=np.uint8)
    with open(path, "wb") as f:
        for name, codes in [("chr1", g.train(0)), ("chr2", g.train(1)), ("chr22", g.eval())]:
            seq = letters[codes & 7] + 32 * ((codes & SOFTMASK_BIT) > 0).astype(np.uint8)
            f.write(f">{name}\n".encode())
            n = len(seq) - len(seq) % 60
            lines = np.concatenate([seq[:n].reshape(-1, 60), np.full((n // 60, 1), ord("\n"), np.uint8)], axis=1)
            f.write(lines.tobytes())
            if n < len(seq):
                f.write(seq[n:].tobytes() + b"\n")
    return path.stat().st_size


def run_worker(*args: str) -> dict:
    env = dict(os.environ, TQDM_DISABLE="1")
    res = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"worker {args} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--scale", type=float, default=1.0, help="chromosome sizes x this (1.0: hg38's)")
    ap.add_argument("--no-prepare", action="store_true", help="skip the end-to-end prepare cases")
    ap.add_argument("--json", default=str(HERE / "results" / "bench_leakage.json"))
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        mode, *rest = args.worker
        if mode == "index":
            r = worker_index(args.k, [int(x) for x in rest[0].split(",")], int(rest[1]))
        else:
            r = worker_prepare(args.k, rest[0], rest[1])
        print(json.dumps(r))
        return

    size = lambda n: int(n * args.scale)  # noqa: E731
    chr1, chr2, chr22 = size(CHR1), size(CHR2), size(CHR22)
    load = os.getloadavg()
    rows = []
    for name, train in (("index, chr1-sized train", [chr1]), ("index, chr1 + chr2", [chr1, chr2])):
        r = run_worker("index", ",".join(map(str, train)), str(chr22), "--k", str(args.k))
        rows.append({"case": name, "train_bases": sum(train), "eval_bases": chr22, **r,
                     "build_mbp_per_s": sum(train) / 1e6 / r["build_seconds"],
                     "query_mbp_per_s": chr22 / 1e6 / r["query_seconds"]})
    if not args.no_prepare:
        with tempfile.TemporaryDirectory(prefix="bench_leakage_") as tmp:
            fasta = Path(tmp) / "genome.fa"
            fasta_bytes = write_fasta(fasta, Genome([chr1, chr2], chr22))
            for name, k in (("prepare --leakage-k", args.k), ("prepare (no leakage mask)", 0)):
                r = run_worker("prepare", str(fasta), str(Path(tmp) / "out"), "--k", str(k))
                rows.append({"case": name, "train_bases": chr1 + chr2, "eval_bases": chr22, "fasta_bytes": fasta_bytes,
                             **r, "mbp_per_s": (chr1 + chr2 + chr22) / 1e6 / r["seconds"]})
    result = {"k": args.k, "scale": args.scale, "limit_bytes": LIMIT_BYTES,
              "within_limit": all(r["max_rss_bytes"] <= LIMIT_BYTES for r in rows),
              "index": "sorted uint64 canonical k-mer codes (exact membership)", "false_positive_rate": 0.0,
              "rows": rows, "cpus": os.cpu_count(), "load_average_before": load,
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")

    gb = 1e9
    print(f"{'case':<26} {'train Mbp':>9} {'eval Mbp':>8} {'distinct K-mers':>15} {'build s':>7} {'build Mbp/s':>11} "
          f"{'query s':>7} {'query Mbp/s':>11} {'total s':>7} {'peak RSS GB':>11} {'masked %':>8}")
    for r in rows:
        build = lambda key, fmt: format(r[key], fmt) if key in r else "-"  # noqa: E731
        masked = f"{100 * r['masked_fraction']:.2f}" if r.get("masked_fraction") is not None else "-"
        distinct = f"{r['kmers_distinct']:,}" if r.get("kmers_distinct") else "-"
        print(f"{r['case']:<26} {r['train_bases'] / 1e6:>9.1f} {r['eval_bases'] / 1e6:>8.1f} {distinct:>15} "
              f"{build('build_seconds', '.1f'):>7} {build('build_mbp_per_s', '.1f'):>11} "
              f"{build('query_seconds', '.1f'):>7} {build('query_mbp_per_s', '.1f'):>11} {r['seconds']:>7.1f} "
              f"{r['max_rss_bytes'] / gb:>11.2f} {masked:>8}")
    for r in rows[:2]:
        print(f"{r['case']}: planted {100 * r['planted_fraction']:.2f}% of the eval bases, "
              f"{100 * r['planted_marked']:.2f}% of them marked (a third carry a substitution every 100 bases, "
              f"which no K-mer covers); {r['marked_next_to_planted']} marked just beside them (chance extensions), "
              f"{r['marked_far_from_planted']} farther than K: false-positive rate 0 (exact index)")
    print(f"peak RSS {max(r['max_rss_bytes'] for r in rows) / gb:.2f} GB at most: "
          f"{'within' if result['within_limit'] else 'OVER'} the {LIMIT_BYTES / gb:.0f} GB bound; "
          f"load average before {load[0]:.1f}  ->  {args.json}")


if __name__ == "__main__":
    main()
