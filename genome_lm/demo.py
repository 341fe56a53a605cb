"""`make demo`: the bundled default, end to end, on the synthetic genome, CPU only.

    synthetic genome -> prepare (train chr1+chr2, eval chr22) -> train the base model at short
    context -> evaluate it -> fine-tune at long context from it -> evaluate -> compare -> report

Each step is skipped when its output is already complete, so a rerun is quick. `--quick` runs a
smaller version of every step (a few minutes; the test suite runs it).

    python -m genome_lm.demo [--quick] [--root .]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from genome_lm.errors import GenomeLMError

log = logging.getLogger("genome_lm.demo")
EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


@dataclass(frozen=True)
class Recipe:
    scale: float  # synthetic genome size multiplier (1.0 = 4 Mbp)
    window: str  # prepare --seq-len: the eval context
    base_steps: int
    long_steps: int
    eval_windows: int


FULL = Recipe(scale=1.0, window="8k", base_steps=1200, long_steps=200, eval_windows=12)
QUICK = Recipe(scale=0.25, window="2k", base_steps=6, long_steps=3, eval_windows=2)

# The demo genome (`genome-lm synth --set ...`): two kinds of repeat that teach two things.
# Interspersed copies (~28% of the bases), mostly out of the base model's 256-token reach but
# within the 8k fine-tune's; tandem arrays in the space left (~46%), which put copies within 256
# tokens so that a model trained from scratch learns in-context copying at all. The default
# genome's repeats are more realistic but not learnable by a from-scratch CPU model in minutes.
DEMO_GENOME = dict(
    n_families=2000, family_min_len=100, family_max_len=1000, repeat_fraction=0.3,
    min_distance=500, max_distance=8000, substitution_rate=0.01, indel_rate=0.0, reverse_fraction=0.0,
    tandem_fraction=0.5, tandem_unit_min=10, tandem_unit_max=80, tandem_copies_min=4, tandem_copies_max=30,
    segdup_count=5, segdup_max_len=5000, segdup_region=(0.17, 0.30),  # chr22 shares sequence with chr1/chr2
)


def _train(exp: str, out: Path, steps: int, extra: list[str]) -> None:
    from genome_lm.config import load_experiment
    from genome_lm.train import train
    from genome_lm.train.checkpoint import latest_checkpoint

    latest = latest_checkpoint(out / "checkpoints")
    if latest is not None and int(latest.name.split("_")[1]) >= steps:
        log.info("    %s is complete (%s); reusing it", out, latest.name)
        return
    cfg = load_experiment(EXPERIMENTS / exp, [f"train.steps={steps}", *extra])
    train(cfg, out=out, resume=latest is not None)


def _eval(checkpoint: Path, shards: Path, out: Path, windows: int) -> dict:
    from genome_lm.eval import EvalConfig, evaluate, load_summary

    if (out / "summary.json").exists():
        log.info("    %s is complete; reusing it", out)
        return load_summary(out)
    return evaluate(EvalConfig(checkpoint=str(checkpoint), shards=str(shards), out=str(out), max_windows=windows))


def run(root: Path, quick: bool = False) -> dict:
    from genome_lm.eval import format_table, write_compare
    from genome_lm.genome.prepare import PrepareParams, prepare
    from genome_lm.genome.synth import make_params, write_synthetic_fasta
    from genome_lm.report import write_report

    r = QUICK if quick else FULL
    tag = "demo_quick" if quick else "demo"
    fasta = root / "data" / "generated" / f"{tag}.fa.gz"
    shards = root / "shards" / tag
    base, long = root / "runs" / f"{tag}_base", root / "runs" / f"{tag}_longctx"
    ev_base, ev_long = root / "evals" / f"{tag}_base", root / "evals" / f"{tag}_longctx"
    cmp_dir, report = root / "evals" / f"{tag}_base_vs_longctx", root / "reports" / f"{tag}.html"
    t0 = time.perf_counter()

    log.info(f"[1/8] synthetic genome -> {fasta}")
    if fasta.exists():
        log.info("    %s exists; reusing it", fasta)
    else:
        write_synthetic_fasta(fasta, scale=r.scale, seed=0, params=make_params(**DEMO_GENOME))

    log.info(f"[2/8] prepare: train chr1,chr2 / eval chr22, {r.window}-token windows -> {shards}")
    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms="chr1,chr2", eval_chroms="chr22",
                                    seq_len=r.window, min_gap="1000", max_n_frac=0.05, tail="keep",
                                    min_len=r.window, reverse_complement=True, leakage_k=32)
    manifest = prepare(params, shards)

    data = [f"data.shards={shards}"]
    log.info(f"[3/8] train the base model at short context -> {base}")
    _train("demo_base.yaml", base, r.base_steps, data)
    log.info(f"[4/8] evaluate the base model on chr22 -> {ev_base}")
    s_base = _eval(base / "checkpoints" / "last", shards, ev_base, r.eval_windows)
    log.info(f"[5/8] fine-tune at {r.window} context from the base model -> {long}")
    _train("demo_longctx.yaml", long, r.long_steps,
           data + [f"model.init={base / 'checkpoints' / 'last'}", f"data.seq_len={r.window}"])
    log.info(f"[6/8] evaluate the long-context model on chr22 -> {ev_long}")
    s_long = _eval(long / "checkpoints" / "last", shards, ev_long, r.eval_windows)
    log.info(f"[7/8] compare -> {cmp_dir}")
    result = write_compare(ev_base, ev_long, cmp_dir, overwrite=True)
    log.info(f"[8/8] report -> {report}")
    write_report([ev_base, ev_long, cmp_dir], report, runs=[base, long], title="genome_lm demo: base vs long context")

    elapsed = time.perf_counter() - t0
    print()
    print(f"genome_lm demo ({'quick' if quick else 'full'}) finished in {elapsed / 60:.1f} min")
    for split, info in manifest["splits"].items():
        print(f"  shards {split:<5}: {info['windows']:>4} windows, {info['tokens']:>10,} tokens "
              f"({', '.join(info['chroms'])})")
    print(f"  held-out chr22 loss, bits/base: base {s_base['overall']['bits_per_base']:.4f}, "
          f"long-context {s_long['overall']['bits_per_base']:.4f}")
    print(format_table(result))
    print(f"  report: {report}")
    return {"base": s_base, "longctx": s_long, "compare": result, "report": str(report)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m genome_lm.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller version of every step, for tests")
    ap.add_argument("--root", default=".", help="where data/, shards/, runs/, evals/, reports/ are written")
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
