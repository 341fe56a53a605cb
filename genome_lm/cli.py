"""`genome-lm`: thin subcommands, their flags built from pydantic parameter models (`options.add_options`)
in light modules; each command imports its implementation when it runs, so `--help` answers at once.
A `GenomeLMError` is one line and a non-zero exit."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib import import_module
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic.config import JsonDict

import genome_lm
from genome_lm.errors import EXIT_PREEMPTED, STORAGE_ERRORS, GenomeLMError, Preempted
from genome_lm.options import Params, add_options, from_args
from genome_lm.outputs import check_out_path, holding, release_all
from genome_lm.sizes import DEFAULT_MAX_SHARD_BYTES, Size

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is: it stops and cleans up as after Ctrl-C."""


def _terminate(signum, frame) -> None:
    raise Terminated


POSITIONAL: JsonDict = {"positional": True}
SET: JsonDict = {"flag": "--set", "repeat": True, "metavar": "KEY=VALUE"}


class Workers(Params):
    """Where `score` runs: one process, N local processes, or Ray."""

    nproc: int | None = Field(default=None, ge=1, json_schema_extra={"metavar": "N"},
                              description="run on N local processes (torch elastic launcher; one per GPU, gloo on "
                              "CPU)")
    ray: str | None = Field(default=None, json_schema_extra={"const": "", "metavar": "ADDRESS"},
                            description="run under Ray on the cluster at ADDRESS (ray://HOST:10001, auto), or on a "
                            "local Ray instance without ADDRESS; one worker per GPU, or --nproc N CPU workers")


class Launch(Workers):
    """Where `train` and `eval` run, and how: also a dry run, and restarts."""

    dry_run: bool = Field(default=False, description="check everything on the meta device and print the layout "
                          "and memory per rank (with --nproc N: on N GPUs); runs nothing, needs no GPU")
    max_restarts: int = Field(default=0, ge=0, json_schema_extra={"metavar": "N"},
                              description="restart the workers up to N times after a failure (a lost worker, a "
                              "preempted one, a hang the watchdog aborted); each restart resumes from the newest "
                              "complete checkpoint (docs/long-runs.md)")


class TrainParams(Params):
    experiment: str = Field(json_schema_extra=POSITIONAL, description="experiment file, e.g. "
                            "experiments/demo_base.yaml")
    overrides: list[str] = Field(default=[], json_schema_extra=SET, description="override a config value, e.g. "
                                 "--set train.lr=1e-5 (repeatable)")
    out: str | None = Field(default=None, description="run directory (default runs/NAME)")
    resume: bool = Field(default=False, description="continue from the newest checkpoint in --out")


class PrepareOutput(Params):
    out: str = Field(description="shards directory to write")
    overwrite: bool = Field(default=False, description="replace --out if it holds shards an earlier prepare wrote")


class SynthOutput(Params):
    out: str = Field(description="output FASTA path (.fa.gz)")
    scale: float = Field(default=1.0, description="size multiplier; 1.0 is the default few-Mbp genome")
    seed: int = 0
    overwrite: bool = False


class ExportParams(Params):
    checkpoint: str = Field(json_schema_extra=POSITIONAL, description="RUN/checkpoints/step_N or RUN/checkpoints/last")
    out: str = Field(description="model directory to write")
    overwrite: bool = Field(default=False, description="replace --out if it exists")
    max_shard_size: Size = Field(default=DEFAULT_MAX_SHARD_BYTES, description="largest safetensors file, e.g. 512M; "
                                 "checkpoints' model/ directories use the default")


class CompareParams(Params):
    eval_a: str = Field(json_schema_extra=POSITIONAL, description="baseline eval directory (replicates of one model, "
                        "e.g. training seeds: comma-separated, A1,A2,...)")
    eval_b: str = Field(json_schema_extra=POSITIONAL, description="eval directory compared against it (replicates: "
                        "B1,B2,... in the same seed order as A's)")
    out: str = Field(description="output directory (compare.json)")
    overwrite: bool = False


class ReportParams(Params):
    dirs: list[str] = Field(default=[], json_schema_extra=POSITIONAL, description="eval or compare output directories")
    runs: list[str] = Field(default=[], json_schema_extra={"flag": "--run", "repeat": True, "metavar": "RUN_DIR"},
                            description="training run (metrics.jsonl); repeatable")
    title: str = "genome_lm: loss by preceding context"
    out: str = Field(description="HTML file to write")
    overwrite: bool = Field(default=False, description="replace --out if it is an existing report or HTML page")


class DemoParams(Params):
    quick: bool = Field(default=False, description="a smaller version of every step (a few minutes; the test suite "
                        "runs it)")
    root: str = Field(default=".", description="where data/, shards/, runs/, evals/ and reports/ are written")
    overrides: list[str] = Field(default=[], json_schema_extra=SET, description="change the recipe (repeatable): "
                                 "base_steps, finetune_steps, model (a preset), window, scale, eval_windows, context; "
                                 "outputs are then named demo_NAME-VALUE...; extra_seeds=2,3 also trains both "
                                 "fine-tunes with those seeds and compares them pooled over seeds (docs/demo.md)")


def _train(p: TrainParams, run: Launch) -> None:
    from genome_lm.config import load_experiment
    from genome_lm.train import train

    cfg = load_experiment(p.experiment, p.overrides)
    if run.dry_run:  # the run's checks, then the planner's verdict for the layout they checked
        from genome_lm.plan.command import PlanParams, build
        from genome_lm.plan.dry_run import train_dry_run
        from genome_lm.plan.planner import make_plan

        world = train_dry_run(cfg, world=run.nproc)
        plan = make_plan(*build(PlanParams(experiment=p.experiment, overrides=p.overrides, gpus=world))[:4])
        assert plan.cluster is not None, "build() always makes a cluster"
        gib = 2**30
        print(f"planner ({plan.cluster.gpus} x {plan.device}): peak {plan.peak_gpu_bytes / gib:,.1f} GiB per GPU at "
              f"{plan.memory.peak_where} (needs {plan.needed_gpu_bytes / gib:,.1f} GiB with the allocator and runtime "
              f"margins), host {plan.host_bytes_per_gpu / 1e9:,.1f} GB per GPU; "
              f"{'fits' if plan.fits else 'DOES NOT FIT: ' + '; '.join(plan.problems)} "
              f"(genome-lm plan {p.experiment} for the breakdown)")
    elif run.ray is not None or (run.nproc or 1) > 1 or run.max_restarts:
        from genome_lm.parallel.launch import run_local, run_ray
        from genome_lm.train.trainer import train_job

        job = train_job(cfg, p.out, p.resume)
        with holding(job.work_dir, "train"):  # for the whole launch: restarted workers work under it too
            if run.ray is None:
                run_local(job, run.nproc or 1, run.max_restarts)
            else:
                run_ray(job, run.ray or None, run.nproc, run.max_restarts)
    else:
        train(cfg, out=p.out, resume=p.resume)


def _eval(cfg, run: Launch) -> str | None:
    if run.dry_run:
        from genome_lm.plan.dry_run import eval_dry_run

        eval_dry_run(cfg, world=run.nproc)
        return None
    from genome_lm.eval.run import evaluate, launch
    from genome_lm.eval.text import format_summary

    launched = run.ray is not None or (run.nproc or 1) > 1 or run.max_restarts
    s = launch(cfg, run.nproc, ray=run.ray, max_restarts=run.max_restarts) if launched else evaluate(cfg)
    return format_summary(s, cfg.out)


def storage_message(e: OSError, out: str | None = None) -> str:
    """One line for a storage failure: what happened, where (the file, else the command's `out`), what to do."""
    assert e.errno is not None, "the caller passes only errors whose errno is in STORAGE_ERRORS"
    where = f" writing {e.filename}" if e.filename else f" writing under --out {out}" if out else ""
    fix = ("free space there or choose another --out" if e.errno in (errno.ENOSPC, errno.EDQUOT)
           else "choose a writable --out")
    return f"{STORAGE_ERRORS[e.errno]}{where}; {fix} (outputs are renamed into place only when complete)"


# what a score or an eval that stopped early keeps: (its folder for --out, the files in it, what they are, a fix)
KEPT = {"score": ("score.run:work_dir_for", "done/*", "region(s)", ""),
        "eval": ("eval.outputs:cache_dir_for", "w*.npz", "window(s)", " (delete it to start over)")}


def _kept(args, out: str | None) -> str:
    """What a fetch, an eval or a score that stopped early (output `out`) keeps for a rerun."""
    if not out or args.command not in ("fetch", *KEPT):
        return ""
    if args.command == "fetch":
        parts = sorted(p.name for p in Path(out).glob("*.part"))
        return (f"; {', '.join(parts)} in {out} (the bytes received) are kept, and the same fetch command "
                "resumes from them") if parts else ""
    folder, pattern, what, fix = KEPT[args.command]
    kept = _model(folder)(Path(out))
    n = len(list(kept.glob(pattern)))
    return (f"; the {n} {what} scored so far are kept in {kept}, and the same {args.command} command resumes "
            f"from them{fix}") if n else ""


@dataclass(frozen=True)
class Command:
    """A subcommand: `run` (or "module:function", a module of genome_lm) gets one parameter model per class
    (or "module:Class", imported when its parser is built) of `models`, then of `files` (the model `--config`
    and `--set` fill; flags of its own only when one of `models`), and its result is printed unless None."""

    run: Callable[..., str | None] | str
    help: str
    models: tuple[type[Params] | str, ...] = ()
    files: str | None = None


PREPARE, EVAL, SCORE = "genome.params:PrepareParams", "eval.config:EvalConfig", "score.params:ScoreParams"
COMMANDS = {
    "demo": Command("demo:run", "the whole pipeline on the bundled synthetic genome: base, long- and short-context "
                    "fine-tunes, evals, compares and a report (what `make demo` runs; docs/demo.md)", (DemoParams,)),
    "synth": Command("genome.synth:synth_command", "write the deterministic synthetic genome (gzip FASTA: chr1, "
                     "chr2, chr22)", (SynthOutput,), files="genome.params:SynthParams"),
    "fetch": Command("genome.fetch:fetch_command", "download hg38 chromosomes from UCSC and verify their md5 sums",
                     ("genome.params:FetchParams",)),
    "prepare": Command("genome.prepare:prepare_command", "FASTA -> windows of single-nucleotide tokens -> dataset "
                       "shards + manifest", (PREPARE, PrepareOutput), files=PREPARE),
    "train": Command(_train, "fine-tune a model from an experiment YAML", (TrainParams, Launch)),
    "export": Command("train.checkpoint:export_command", "a training checkpoint's weights (train_state/) as a Hugging "
                      "Face-style model directory, for checkpoints saved without model/", (ExportParams,)),
    "eval": Command(_eval, "score held-out windows: per-token NLL and loss by preceding context", (EVAL, Launch),
                    files=EVAL),
    "score": Command("score.run:score_command", "per-base log-probs (and embeddings) of FASTA regions at any "
                     "length, chunk by chunk with the model's state carried (equal to one pass)", (SCORE, Workers),
                     files=SCORE),
    "compare": Command("eval.compare:compare_command", "paired comparison of two evals of the same windows, by "
                       "context bucket (or of two sets of replicate evals, with CIs over training seeds)",
                       (CompareParams,)),
    "report": Command("report.html:report_command", "self-contained HTML report (plots + tables) from "
                      "eval/compare/run directories", (ReportParams,)),
    "variants": Command("score.variants:variants_command", "score the variants of a VCF by preceding context: "
                        "log P(alt) - log P(ref) at each context length, AUROC/AUPRC with labels",
                        ("score.params:VariantsParams",)),
    "check-upstream": Command("model.build:check_upstream", "check the installed transformers against every "
                              "upstream symbol, attribute and signature genome_lm relies on"),
    "plan": Command("plan.command:run", "memory per GPU, host memory and tokens/s of a run, before renting GPUs",
                    ("plan.command:PlanParams",)),
    "rehearse": Command("plan.command:run_rehearse", "one full-size training step on fake tensors and N fake ranks, "
                        "its memory measured by FSDP2's tracker beside the planner's prediction",
                        ("plan.command:RehearseParams",)),
}


def _model(ref: Any) -> Any:
    """A class or function, or the one "module:name" names (a module of genome_lm)."""
    if not isinstance(ref, str):
        return ref
    module, name = ref.split(":")
    return getattr(import_module(f"genome_lm.{module}"), name)


def _call(run: Callable[..., str | None] | str, refs: list, args: argparse.Namespace) -> None:
    result = _model(run)(*[from_args(_model(ref), args) for ref in refs])
    if result is not None:
        print(result)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the flags of the command that `argv` names (of every command without `argv`)."""
    parser = argparse.ArgumentParser(prog="genome-lm", description=genome_lm.__doc__)
    parser.add_argument("--version", action="version", version=f"genome-lm {genome_lm.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = None if argv is None else next((a for a in argv if not a.startswith("-")), None)
    for name, command in COMMANDS.items():
        refs = [*command.models, *([command.files] if command.files not in (None, *command.models) else [])]
        p = sub.add_parser(name, help=command.help, description=command.help)
        p.set_defaults(func=partial(_call, command.run, refs), parser=p)
        if argv is not None and name != named:
            continue
        for ref in refs:
            add_options(p, _model(ref), fields=ref in command.models, files=ref == command.files)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:  # Ctrl-C while the parser is built, before a command runs
        print("genome-lm: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str]) -> int:
    args, unknown = build_parser(argv).parse_known_args(argv)
    if unknown:  # the command's own usage and name, where argparse would print the top-level ones
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    rank = int(os.environ.get("RANK", "0"))  # one process of a launch torchrun or srun started: rank 0 speaks
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s {f'rank{rank} ' if 'RANK' in os.environ else ''}%(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    out = getattr(args, "out", None)  # every command's output path, when given as a flag
    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        if out is not None:
            check_out_path(out)
        args.func(args)
    except (GenomeLMError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in STORAGE_ERRORS:
            raise
        why = f"{storage_message(e, out)}{_kept(args, out)}" if isinstance(e, OSError) else e
        print(f"genome-lm {args.command}: error: {why}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as e:
        how = ("terminated (SIGTERM)", 128 + signal.SIGTERM) if isinstance(e, Terminated) else \
            ("interrupted", EXIT_INTERRUPTED)
        print(f"genome-lm {args.command}: {how[0]}{_kept(args, out)}", file=sys.stderr)
        return how[1]
    except Preempted as e:
        resume = shlex.join(["genome-lm", *[a for a in argv if a != "--resume"], "--resume"])
        print(f"genome-lm {args.command}: preempted: {e}; resume with: {resume}", file=sys.stderr)
        return EXIT_PREEMPTED
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old)
        release_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
