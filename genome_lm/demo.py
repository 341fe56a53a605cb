"""`make demo`: the bundled default, end to end, on the synthetic genome, CPU only.

Steps that exist so far: synthetic genome -> prepare (train chr1+chr2, eval chr22). Later
steps (train, eval, compare, report) are added as those commands land. Each step is skipped
when its output is already complete, so a rerun is quick.

    python -m genome_lm.demo [--quick] [--root .]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from genome_lm.errors import GenomeLMError

log = logging.getLogger("genome_lm.demo")


def run(root: Path, quick: bool = False) -> dict:
    from genome_lm.genome.prepare import PrepareParams, prepare
    from genome_lm.genome.synth import write_synthetic_fasta

    scale = 0.25 if quick else 1.0
    tag = "demo_quick" if quick else "demo"
    fasta = root / "data" / "generated" / f"{tag}.fa.gz"
    shards = root / "shards" / tag
    t0 = time.perf_counter()

    if fasta.exists():
        log.info("[1/2] synthetic genome: %s exists, reusing it", fasta)
    else:
        log.info("[1/2] synthetic genome -> %s", fasta)
        write_synthetic_fasta(fasta, scale=scale, seed=0)

    log.info("[2/2] prepare: train chr1,chr2 / eval chr22, 32k-token windows -> %s", shards)
    params = PrepareParams.from_cli(
        fasta=[str(fasta)], train_chroms="chr1,chr2", eval_chroms="chr22", seq_len="32k", min_gap="1000",
        max_n_frac=0.05, tail="keep", min_len="4k", reverse_complement=True,
    )
    manifest = prepare(params, shards)
    elapsed = time.perf_counter() - t0
    print()
    print(f"genome_lm demo ({'quick' if quick else 'full'}) finished in {elapsed:.1f}s")
    print(f"  synthetic genome : {fasta}")
    print(f"  shards           : {shards}/ (manifest.json, train/, eval/)")
    for split, info in manifest["splits"].items():
        print(f"    {split:<5}: {info['windows']:>4} windows, {info['tokens']:>10,} tokens from {', '.join(info['chroms'])}")
    print("  load them with   : genome_lm.genome.load_shards('%s', 'train')" % shards)
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m genome_lm.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller genome, for tests")
    ap.add_argument("--root", default=".", help="where data/, shards/, runs/ ... are written")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        run(Path(args.root), quick=args.quick)
    except GenomeLMError as e:
        print(f"genome-lm demo: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
