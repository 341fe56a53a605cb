"""Does a model copy? An eval's loss on synth's planted copies, by distance to their source.

    python benchmarks/probe_copy_distance.py REPEATS_TSV EVAL_DIR [EVAL_DIR ...] [--out FILE.json]

REPEATS_TSV is the sidecar `genome-lm synth` writes beside its FASTA (chrom, start, end, strand,
family, source_start; tandem units and interspersed copies, source_start -1 for a family's first).
For each eval directory (`genome-lm eval --out`), the forward rows of tokens.parquet are split into
the bases of a copy whose source starts inside the same window, by start-to-start distance (< 256,
256-1k, 1k-8k, >= 8k), and all other bases. The first `--skip` bases of each copy are left out
(a reader needs a few to find the source). A model that copies scores the copy classes far below
the rest; one that does not scores them about as the rest (or worse: a family's sequence is
uniform, the background need not be). Prints mean NLL (nats) and token counts; writes JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from genome_lm.eval.outputs import iter_windows

EDGES = [0, 256, 1024, 8192, np.iinfo(np.int64).max]
NAMES = ["copy <256", "copy 256-1k", "copy 1k-8k", "copy >=8k", "other"]


def copies(tsv: Path) -> dict[str, np.ndarray]:
    """chrom -> int64 [n, 3]: start, end, source_start of the copies with a source."""
    out: dict[str, list] = {}
    with open(tsv) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            if int(r["source_start"]) >= 0:
                out.setdefault(r["chrom"], []).append((int(r["start"]), int(r["end"]), int(r["source_start"])))
    return {c: np.asarray(v, dtype=np.int64) for c, v in out.items()}


def probe(eval_dir: Path, reps: dict[str, np.ndarray], skip: int) -> dict:
    sums, counts = np.zeros(len(NAMES)), np.zeros(len(NAMES), dtype=np.int64)
    for row in iter_windows(eval_dir, "forward"):  # the rows as stored, not their reverse complements
        if row["strand"] != "+":
            continue
        nll = np.asarray(row["nll"], dtype=np.float64)
        s0, n = row["start"], len(nll)
        cls = np.full(n, len(NAMES) - 1)
        for a, b, src in reps.get(row["chrom"], np.zeros((0, 3), dtype=np.int64)):
            if b <= s0 or a >= s0 + n or src < s0:  # not in the window, or its source is not
                continue
            k = int(np.searchsorted(EDGES, a - src, side="right")) - 1
            cls[max(a + skip, s0) - s0:min(b, s0 + n) - s0] = k
        ok = np.isfinite(nll)
        np.add.at(sums, cls[ok], nll[ok])
        np.add.at(counts, cls[ok], 1)
    return {name: {"mean_nll": float(sums[k] / counts[k]) if counts[k] else None, "tokens": int(counts[k])}
            for k, name in enumerate(NAMES)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repeats", type=Path)
    ap.add_argument("evals", type=Path, nargs="+")
    ap.add_argument("--skip", type=int, default=20, help="bases at the start of each copy left out")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/probe_copy_distance.json"))
    args = ap.parse_args()
    reps = copies(args.repeats)
    result = {"repeats": str(args.repeats), "skip": args.skip, "units": "nats per base",
              "evals": {str(d): probe(d, reps, args.skip) for d in args.evals}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{'eval':<40} " + " ".join(f"{n:>18}" for n in NAMES))
    for d, r in result["evals"].items():
        cells = [f"{'-' if v['mean_nll'] is None else format(v['mean_nll'], '.3f')} ({v['tokens']:,})"
                 for v in r.values()]
        print(f"{d[-40:]:<40} " + " ".join(f"{c:>18}" for c in cells))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
