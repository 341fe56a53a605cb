"""Variant scoring throughput on CPU: variants per second at 1k and 64k contexts with a tiny model, with
the prefix shared by ref and alt (`genome_lm.score.engine`) and without (ref window and alt window
each scored from scratch, as a windowed score does).

    python benchmarks/bench_variants.py                      # contexts 1k, 64k; 4 SNVs each
    python benchmarks/bench_variants.py --contexts 1k --variants 16

Cost model (tokens forwarded per variant, context L, allele n bases, `--after` N, k ALT alleles at a
locus): shared  L + (k + 1)(n + N);  from scratch  2k(L + n + N). Writes
benchmarks/results/bench_variants.json and prints a table. Not a test.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from genome_lm.model import apply_long_context, build
from genome_lm.model.streaming import score_streaming
from genome_lm.score.engine import score_continuations
from genome_lm.settings import STREAMING_CHUNK_TOKENS
from genome_lm.sizes import format_size, parse_size

RESULTS = Path(__file__).resolve().parent / "results" / "bench_variants.json"


def measure(model, L: int, variants: int, after: int, rng) -> dict:
    """Seconds per SNV at context L, shared prefix vs ref and alt windows from scratch."""
    shared, scratch = [], []
    for _ in range(variants):
        prefix, tail = rng.integers(0, 4, L), rng.integers(0, 4, after)
        ref, alt = np.r_[0, tail], np.r_[1, tail]
        t = time.perf_counter()
        score_continuations(model, prefix, [ref, alt], STREAMING_CHUNK_TOKENS)
        shared.append(time.perf_counter() - t)
        t = time.perf_counter()
        for cont in (ref, alt):
            score_streaming(model, torch.as_tensor(np.r_[prefix, cont])[None], STREAMING_CHUNK_TOKENS)
        scratch.append(time.perf_counter() - t)
    n = 1 + after
    return {"context": L, "variants": variants, "after": after,
            "shared_variants_per_s": round(1 / float(np.median(shared)), 4),
            "scratch_variants_per_s": round(1 / float(np.median(scratch)), 4),
            "shared_tokens_per_variant": L + 2 * n, "scratch_tokens_per_variant": 2 * (L + n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1k,64k")
    ap.add_argument("--variants", type=int, default=4)
    ap.add_argument("--after", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = apply_long_context(build("glm53-tiny").model).eval()
    rng = np.random.default_rng(0)
    score_continuations(model, rng.integers(0, 4, 64), [np.array([0]), np.array([1])])  # warm-up
    rows = [measure(model, parse_size(c), args.variants, args.after, rng) for c in args.contexts.split(",")]
    out = {"model": "glm53-tiny", "device": "cpu", "threads": args.threads, "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'context':>8} {'shared var/s':>13} {'scratch var/s':>14} {'tokens shared':>14} {'tokens scratch':>15}")
    for r in rows:
        print(f"{format_size(r['context']):>8} {r['shared_variants_per_s']:>13.3f} "
              f"{r['scratch_variants_per_s']:>14.3f} {r['shared_tokens_per_variant']:>14,} "
              f"{r['scratch_tokens_per_variant']:>15,}")


if __name__ == "__main__":
    main()
