"""`genome-lm`: thin subcommands. The library does the work; this file parses arguments,
calls it, and turns `GenomeLMError` into a one-line message and a non-zero exit."""

from __future__ import annotations

import argparse
import logging
import sys

from genome_lm.errors import GenomeLMError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def _add_synth(sub: argparse._SubParsersAction) -> None:
    from genome_lm.genome.synth import SynthParams
    from genome_lm.utils import add_options

    p = sub.add_parser("synth", help="write the deterministic synthetic genome (gzip FASTA: chr1, chr2, chr22)")
    p.add_argument("--out", required=True, help="output FASTA path (.fa.gz)")
    p.add_argument("--scale", type=float, default=1.0, help="size multiplier; 1.0 is the default few-Mbp genome")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    add_options(p, SynthParams, fields=False)  # --config, --set NAME=VALUE: fields of synth.py SynthParams
    p.add_argument("--param", action="append", dest="overrides", help=argparse.SUPPRESS)  # older name of --set
    p.set_defaults(func=_run_synth)


def _run_synth(args: argparse.Namespace) -> None:
    from genome_lm.genome.synth import SynthParams, write_synthetic_fasta
    from genome_lm.utils import from_args

    params = from_args(SynthParams, args)
    write_synthetic_fasta(args.out, scale=args.scale, seed=args.seed, overwrite=args.overwrite, params=params)


def _add_fetch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fetch", help="download hg38 chromosomes from UCSC and verify their md5 sums")
    p.add_argument("--chroms", default="chr1,chr2,chr22", help="comma-separated chromosome names")
    p.add_argument("--out", default="data/hg38", help="directory for the .fa.gz files")
    p.add_argument("--base-url", default=None, help="server holding chrN.fa.gz and md5sum.txt")
    p.set_defaults(func=_run_fetch)


def _run_fetch(args: argparse.Namespace) -> None:
    from genome_lm.genome.fetch import DEFAULT_BASE_URL, fetch_chromosomes

    chroms = [c.strip() for c in args.chroms.split(",") if c.strip()]
    fetch_chromosomes(chroms, args.out, base_url=args.base_url or DEFAULT_BASE_URL)


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    from genome_lm.genome.prepare import PrepareParams
    from genome_lm.utils import add_options

    p = sub.add_parser("prepare", help="FASTA -> windows of single-nucleotide tokens -> dataset shards + manifest")
    add_options(p, PrepareParams)
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_run_prepare)


def _run_prepare(args: argparse.Namespace) -> None:
    from genome_lm.genome.prepare import PrepareParams, prepare
    from genome_lm.utils import from_args

    prepare(from_args(PrepareParams, args), args.out, overwrite=args.overwrite)


def _nproc(value: str | None) -> int | None:
    """`--nproc N` as a number of processes (>= 1), None when not given."""
    if value is None:
        return None
    try:
        nproc = int(value)
    except ValueError:
        raise GenomeLMError(f"--nproc {value!r}: expected a number of processes, e.g. --nproc 8") from None
    from genome_lm.parallel.launch import check_count

    return check_count(nproc)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="fine-tune a model from an experiment YAML")
    p.add_argument("experiment", help="experiment file, e.g. experiments/demo_base.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a config value, e.g. --set train.lr=1e-5 (repeatable)")
    p.add_argument("--out", default=None, help="run directory (default runs/NAME)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--dry-run", action="store_true", help="check everything on the meta device, train nothing")
    p.add_argument("--nproc", default=None, metavar="N",
                   help="train on N local processes (torch elastic launcher; one per GPU, gloo on CPU); "
                        "laid out as parallel: {cp, dp}. With --dry-run: print the per-rank shapes for N")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="train under Ray Train on the cluster at ADDRESS (ray://HOST:10001, auto), or on a local "
                        "Ray instance without ADDRESS; one worker per GPU, or --nproc N CPU workers")
    p.set_defaults(func=_run_train)


def _run_train(args: argparse.Namespace) -> None:
    from genome_lm.config import load_experiment
    from genome_lm.train import dry_run, train

    cfg = load_experiment(args.experiment, args.overrides)
    nproc = _nproc(args.nproc)
    if args.dry_run:
        dry_run(cfg, world=nproc)
    elif args.ray is not None or (nproc or 1) > 1:
        from genome_lm.parallel.launch import run_local, run_ray
        from genome_lm.train.launch import train_job

        job = train_job(cfg, args.out, args.resume)
        if args.ray is None:
            run_local(job, nproc)
        else:
            run_ray(job, args.ray or None, nproc)
    else:
        train(cfg, out=args.out, resume=args.resume)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="a training checkpoint's weights (train_state/) as a Hugging Face-style model "
                                      "directory, for checkpoints saved without model/")
    p.add_argument("checkpoint", help="RUN/checkpoints/step_N or RUN/checkpoints/last")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--max-shard-size", default="5G", help="largest safetensors file, e.g. 5G, 512M (default 5G)")
    p.set_defaults(func=_run_export)


def _run_export(args: argparse.Namespace) -> None:
    from genome_lm.train.export import export_checkpoint
    from genome_lm.utils import parse_size

    max_bytes = parse_size(args.max_shard_size, "--max-shard-size")
    out = export_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite, max_shard_bytes=max_bytes)
    print(f"export: {out}")


def _add_eval(sub: argparse._SubParsersAction) -> None:
    from genome_lm.eval.config import EvalConfig
    from genome_lm.utils import add_options

    p = sub.add_parser("eval", help="score held-out windows: per-token NLL and loss by preceding context")
    add_options(p, EvalConfig)
    p.add_argument("--nproc", default=None, metavar="N",
                   help="score on N local processes (torch elastic; one per GPU, gloo on CPU): the model sharded "
                        "over all N (FSDP2), the windows shared out over N / --cp replicas. With --dry-run: the "
                        "memory per rank on N GPUs")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="score under Ray on the cluster at ADDRESS (ray://HOST:10001, auto), or on a local Ray "
                        "instance without ADDRESS; one worker per GPU, or --nproc N CPU workers")
    p.add_argument("--dry-run", action="store_true", help="check the inputs and print the memory per rank (sharded "
                   "weights + one window slab's activations) on --nproc N GPUs; scores nothing, needs no GPU")
    p.set_defaults(func=_run_eval)


def _run_eval(args: argparse.Namespace) -> None:
    from genome_lm.eval.config import EvalConfig
    from genome_lm.utils import from_args

    nproc = _nproc(args.nproc)
    cfg = from_args(EvalConfig, args)
    if args.dry_run:
        from genome_lm.plan.eval_dry_run import dry_run

        dry_run(cfg, world=nproc)
        return
    if args.ray is not None or (nproc or 1) > 1:
        from genome_lm.eval.sharded import launch

        s = launch(cfg, nproc, ray=args.ray)
    else:
        from genome_lm.eval import evaluate

        s = evaluate(cfg)
    o = s["overall"]
    print(f"{cfg.out}: {o['n_tokens']:,} tokens, mean NLL {o['mean_nll']:.4f} nats/token = "
          f"{o['bits_per_base']:.4f} bits/base (95% CI {o['ci_low']:.4f}-{o['ci_high']:.4f} nats)")


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="paired comparison of two evals of the same windows, by context bucket")
    p.add_argument("eval_a", metavar="EVAL_A", help="baseline eval directory")
    p.add_argument("eval_b", metavar="EVAL_B", help="eval directory compared against it")
    p.add_argument("--out", required=True, help="output directory (compare.json)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_run_compare)


def _run_compare(args: argparse.Namespace) -> None:
    from genome_lm.eval import format_table, write_compare

    print(format_table(write_compare(args.eval_a, args.eval_b, args.out, overwrite=args.overwrite)))


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="self-contained HTML report (plots + tables) from eval/compare/run directories")
    p.add_argument("dirs", nargs="*", metavar="DIR", help="eval or compare output directories")
    p.add_argument("--run", action="append", default=[], metavar="RUN_DIR",
                   help="training run (metrics.jsonl); repeatable")
    p.add_argument("--title", default="genome_lm: loss by preceding context")
    p.add_argument("--out", required=True, help="HTML file to write")
    p.set_defaults(func=_run_report)


def _run_report(args: argparse.Namespace) -> None:
    from genome_lm.report import write_report

    print(f"report: {write_report(args.dirs, args.out, runs=args.run, title=args.title)}")


def _add_plan(sub: argparse._SubParsersAction) -> None:
    from genome_lm.plan.command import add_arguments, run

    p = sub.add_parser("plan", help="memory per GPU, host memory and tokens/s of a run, before renting GPUs")
    add_arguments(p)
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    from genome_lm import __version__

    parser = argparse.ArgumentParser(prog="genome-lm", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"genome-lm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_synth, _add_fetch, _add_prepare, _add_train, _add_export, _add_eval, _add_compare, _add_report,
                _add_plan):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        args.func(args)
    except GenomeLMError as e:
        print(f"genome-lm {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"genome-lm {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
