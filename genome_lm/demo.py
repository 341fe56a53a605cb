"""`make demo` (`genome-lm demo [--quick] [--root .] [--set NAME=VALUE ...]`; docs/demo.md): on the
synthetic genome, CPU only, a base model at short context, long- and short-context fine-tunes on as
many tokens, each evaluated, compared pairwise, and a report. A step whose output is complete is skipped."""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from genome_lm.config import load_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import check_writable
from genome_lm.options import apply_override, validate
from genome_lm.outputs import holding, read_marker, what_it_is
from genome_lm.progress import minutes
from genome_lm.sizes import parse_size

log = logging.getLogger("genome_lm.demo")
SOURCE_EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
INSTALLED_EXPERIMENTS = Path(sys.prefix) / "share" / "genome_lm" / "experiments"  # pyproject's data-files


def experiments_dir() -> Path:
    """The experiment YAMLs: the source tree's, else the copy `pip install .` puts under `sys.prefix`."""
    for path in (SOURCE_EXPERIMENTS, INSTALLED_EXPERIMENTS):
        if (path / "demo_base.yaml").is_file():
            return path
    raise GenomeLMError(f"the demo's experiment files are in neither {SOURCE_EXPERIMENTS} nor "
                        f"{INSTALLED_EXPERIMENTS}; run the demo from a genome_lm checkout (`make demo`)")


class Recipe(BaseModel):
    """What `make demo` runs; `--set NAME=VALUE` replaces a field."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    scale: float = Field(gt=0)  # synthetic genome size multiplier (1.0 = 4 Mbp)
    window: str  # prepare --seq-len: the eval context and the long-context fine-tune's
    base_steps: int = Field(gt=0)
    finetune_steps: int = Field(gt=0)  # each fine-tune's; the short-context one takes window / 256 sequences per step
    eval_windows: int | None = Field(default=None, gt=0)  # eval --max-windows; None: every window of the split
    context: str  # eval --context: the ablation's lengths L (targets: the last 1/8 of each window)
    model: str = "glm53-demo"  # the preset all three models are (experiments/demo_*.yaml's model.name)
    extra_seeds: str = ""  # e.g. "2,3": both fine-tunes again per seed S (data.seed = train.seed = S), compared pooled

    @field_validator("extra_seeds")
    @classmethod
    def _seeds(cls, v: str) -> str:
        seeds = [x.strip() for x in v.split(",") if x.strip()]
        if not all(x.isdigit() for x in seeds) or len(set(map(int, seeds))) != len(seeds) or "1" in seeds:
            raise ValueError("expected distinct whole numbers other than 1 (the experiments' own seed), e.g. 2,3")
        return ",".join(seeds)

    @model_validator(mode="after")
    def _sizes_and_model(self) -> "Recipe":
        """What later steps would refuse, refused before any work."""
        from genome_lm.model.presets import PRESETS

        window = parse_size(self.window, "window")
        for length in [x for x in self.context.split(",") if x.strip()]:
            if parse_size(length.strip(), "context") > window - window // 8:
                raise ValueError(f"context {length.strip()} is too long for window {self.window}: the ablation's "
                                 f"targets are the last 1/8 of a window, so a length is at most "
                                 f"{window - window // 8:,} tokens")
        if self.model not in PRESETS and not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"model {self.model!r} is neither a preset (glm53-demo, glm53-tiny, ...) nor a model "
                             "directory")
        return self

    def seed_list(self) -> list[int]:
        return [int(x) for x in self.extra_seeds.split(",") if x]


FULL = Recipe(scale=1.0, window="8k", base_steps=600, finetune_steps=100, context="1k,2k,4k,7k")
QUICK = Recipe(scale=0.25, window="2k", base_steps=6, finetune_steps=3, eval_windows=2, context="256,1k")


def recipe(quick: bool = False, overrides: list[str] | tuple[str, ...] = ()) -> tuple[Recipe, str]:
    """QUICK or FULL with `overrides` ("NAME=VALUE") applied, and the tag naming its outputs: "demo[_quick]" plus
    the overrides (`base_steps=6000` -> "demo_base_steps-6000") but extra_seeds (it adds outputs, reusing the rest)."""
    r, tag = (QUICK, "demo_quick") if quick else (FULL, "demo")
    raw, origin = r.model_dump(), {}
    for item in overrides:
        name, sep, _ = item.partition("=")
        if not sep or "." in name:
            names = ", ".join(Recipe.model_fields)
            raise GenomeLMError(f"--set {item!r}: expected NAME=VALUE with NAME one of {names}")
        origin[apply_override(raw, item)] = f"--set {item!r}"
    r = validate(Recipe, raw, origin=origin, unknown="unknown recipe field")
    suffix = "_".join(f"{k}-{re.sub(r'[^A-Za-z0-9.]+', '-', str(getattr(r, k)))}" for k in origin if k != "extra_seeds")
    return r, f"{tag}_{suffix}" if suffix else tag


# The demo genome (data/README.md, docs/demo.md): an order-6 Markov background with a table of its own
# per isochore (only the sequence before a token reveals it, so an estimate over 7k bases beats one
# over 1k), interspersed copies 500-8000 bases from their source, and segmental duplications of
# chr1/chr2 in chr22 for the leakage mask. No tandem arrays: with them the long-context fine-tune
# learns to forget fast and reads nothing past 1k (docs/findings.md).
DEMO_GENOME = dict(
    markov_order=6, markov_rows="additive", markov_scale=0.4,
    n_families=2000, family_min_len=100, family_max_len=1000, repeat_fraction=0.1,
    min_distance=500, max_distance=8000, substitution_rate=0.01, indel_rate=0.0, reverse_fraction=0.0,
    segdup_count=5, segdup_max_len=5000, segdup_region=(0.17, 0.30),  # chr22 shares sequence with chr1/chr2
)


# Each step's share of the full recipe's time on 2 CPU cores (docs/demo.md).
SHARES = {1: 0.003, 2: 0.001, 3: 0.215, 4: 0.127, 5: 0.279, 6: 0.114, 7: 0.132, 8: 0.121, 9: 0.003, 10: 0.003}


class Timeline:
    """Time so far and an estimate of the time left (time spent scaled by the shares still to run)."""

    def __init__(self, shares: dict[int, float] = SHARES, clock=time.perf_counter):
        self.shares, self.clock, self.t0 = shares, clock, clock()
        self.spent, self.left = 0.0, sum(shares.values())  # shares of the steps that ran / still to come
        self.reused: list[int] = []  # steps whose output was already complete

    def done(self, step: int, ran: bool = True) -> str:
        """Step `step` is over (`ran`: rather than reusing an output); the log line."""
        self.left -= self.shares[step]
        self.spent += self.shares[step] if ran else 0.0
        if not ran:
            self.reused.append(step)
        elapsed = self.clock() - self.t0
        ahead = self.spent > 0 and self.left > 1e-9
        left = f", about {minutes(elapsed / self.spent * self.left)} left" if ahead else ""
        line = f"    [{step}/10] done: {minutes(elapsed)} so far{left}"
        log.info(line)
        return line


def _experiment(exp: str, steps: int, extra: list[str]):
    return load_experiment(experiments_dir() / exp, [f"train.steps={steps}", *extra])


def _train(cfg, out: Path) -> bool:
    """Train `cfg` into `out`, resuming it; False when it is complete already (reused)."""
    from genome_lm.train import train
    from genome_lm.train.checkpoint import latest_checkpoint

    latest = latest_checkpoint(out / "checkpoints")
    if latest is not None and int(latest.name.split("_")[1]) >= cfg.train.steps:
        log.info("    %s is complete (%s); reusing it", out, latest.name)
        return False
    train(cfg, out=out, resume=latest is not None)
    return True


def _tokens_per_step(cfg) -> int:
    return cfg.data.seq_len * cfg.train.micro_batch * cfg.train.grad_accum


def matched_finetunes(r: Recipe, data: list[str], base: Path):
    """The long- and short-context fine-tunes of `r` from run `base`'s last checkpoint: the short one takes
    window / seq_len sequences per step, so that both train on the same tokens."""
    common = [*data, f"model.init={base / 'checkpoints' / 'last'}"]
    long = _experiment("demo_longctx.yaml", r.finetune_steps, [*common, f"data.seq_len={r.window}"])
    short = _experiment("demo_shortctx.yaml", r.finetune_steps, common)
    per_step = _tokens_per_step(long)
    if per_step % (short.data.seq_len * short.train.grad_accum):
        raise ValueError(f"{per_step} tokens per step is no whole number of {short.data.seq_len}-token sequences")
    short.train.micro_batch = per_step // (short.data.seq_len * short.train.grad_accum)
    assert short.data.seq_len < long.data.seq_len
    return long, short


def _eval(checkpoint: Path, shards: Path, out: Path, r: Recipe) -> tuple[dict, bool]:
    """eval with the context ablation (`r.context`) and both strands; (summary, False when reused)."""
    from genome_lm.eval import EvalConfig, evaluate, load_summary

    if (out / "summary.json").exists():
        log.info("    %s is complete; reusing it", out)
        return load_summary(out), False
    return evaluate(EvalConfig(checkpoint=str(checkpoint), shards=str(shards), out=str(out), max_windows=r.eval_windows,
                               context=r.context, strands="both")), True


def _extra_seeds(r: Recipe, data: list[str], runs: dict, evals: dict, shards: Path) -> dict[str, list[Path]]:
    """Both fine-tunes again per extra seed S (data.seed = train.seed = S; outputs RUN_seedS), evaluated
    -> {"base": [eval], "shortctx"|"longctx": [evals, seed 1 first]}."""
    replicate = {name: [out] for name, out in evals.items()}
    for S in r.seed_list():
        long, short = matched_finetunes(r, [*data, f"data.seed={S}", f"train.seed={S}"], runs["base"])
        for name, cfg in (("longctx", long), ("shortctx", short)):
            run_dir, out = (d[name].with_name(f"{d[name].name}_seed{S}") for d in (runs, evals))
            log.info(f"[+] fine-tune seed {S}: {name} -> {run_dir}, evaluated -> {out}")
            _train(cfg, run_dir)
            _eval(run_dir / "checkpoints" / "last", shards, out, r)
            replicate[name].append(out)
    return replicate


PAIRS = (("base", "shortctx"), ("base", "longctx"), ("shortctx", "longctx"))  # the compares, (A, B): B - A
NAMES = {"base": "base", "short": "shortctx", "long": "longctx"}  # report.matched's roles -> this module's names


def run(p) -> None:
    """`genome-lm demo`: the whole demo under `p.root` (`p`: its DemoParams), holding its lock throughout."""
    r, tag = recipe(p.quick, p.overrides)
    root = Path(p.root)
    check_writable(root, "--root")
    resolved = root.resolve()
    if (output := next((d for d in (resolved, *resolved.parents) if read_marker(d) is not None
                        or (d / "manifest.json").is_file()), None)) is not None:
        raise GenomeLMError(f"--root {root} lies inside {what_it_is(output)} ({output}), which its command replaces "
                            "whole; choose a --root outside it")
    with holding(root, "demo", "--root", inside=True):
        _run(root, p.quick, r, tag)


def _run(root: Path, quick: bool, r: Recipe, tag: str) -> None:
    from genome_lm.eval import write_compare
    from genome_lm.genome.params import make_params
    from genome_lm.genome.prepare import PrepareParams, prepare
    from genome_lm.genome.synth import write_synthetic_fasta
    from genome_lm.report import context_gain, load_compare_dir, write_report

    fasta = root / "data" / "generated" / f"{tag}.fa.gz"
    shards = root / "shards" / tag
    runs = {name: root / "runs" / f"{tag}_{name}" for name in ("base", "longctx", "shortctx")}
    evals = {name: root / "evals" / f"{tag}_{name}" for name in runs}
    cmp_dirs = {p: root / "evals" / f"{tag}_{p[0]}_vs_{p[1]}" for p in PAIRS}
    report = root / "reports" / f"{tag}.html"
    timeline = Timeline()

    log.info(f"[1/10] synthetic genome -> {fasta}")
    reuse = fasta.exists()
    if reuse:
        log.info("    %s exists; reusing it", fasta)
    else:
        write_synthetic_fasta(fasta, scale=r.scale, seed=0, params=make_params(**DEMO_GENOME))
    timeline.done(1, ran=not reuse)

    log.info(f"[2/10] prepare: train chr1,chr2 / eval chr22, {r.window}-token windows -> {shards}")
    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms="chr1,chr2", eval_chroms="chr22",
                                    seq_len=r.window, min_gap="1000", max_n_frac=0.05, tail="keep",
                                    min_len=r.window, reverse_complement=True, leakage_k=32)
    prepared = (shards / "manifest.json").is_file()
    manifest = prepare(params, shards)
    timeline.done(2, ran=not prepared)

    data = [f"data.shards={shards}", f"model.name={r.model}"]  # every experiment's
    summaries = {}
    log.info(f"[3/10] train the base model at short context -> {runs['base']}")
    timeline.done(3, _train(_experiment("demo_base.yaml", r.base_steps, data), runs["base"]))
    log.info(f"[4/10] evaluate the base model on chr22 -> {evals['base']}")
    summaries["base"], ran = _eval(runs["base"] / "checkpoints" / "last", shards, evals["base"], r)
    timeline.done(4, ran)
    long, short = matched_finetunes(r, data, runs["base"])
    for n, (name, cfg, what) in enumerate((("longctx", long, "long"), ("shortctx", short, "short"))):
        log.info(f"[{5 + 2 * n}/10] fine-tune the base model at {what} context ({cfg.data.seq_len:,} tokens x "
                 f"{cfg.train.micro_batch} per step, {cfg.train.steps} steps: "
                 f"{cfg.train.steps * _tokens_per_step(cfg):,} tokens) -> {runs[name]}")
        timeline.done(5 + 2 * n, _train(cfg, runs[name]))
        log.info(f"[{6 + 2 * n}/10] evaluate the {what}-context model on chr22 -> {evals[name]}")
        summaries[name], ran = _eval(runs[name] / "checkpoints" / "last", shards, evals[name], r)
        timeline.done(6 + 2 * n, ran)
    replicates = _extra_seeds(r, data, runs, evals, shards)
    seed_dirs = {p: d.with_name(f"{d.name}_seeds") for p, d in cmp_dirs.items()} if r.extra_seeds else {}
    log.info("[9/10] compare, pairwise -> %s", ", ".join(str(d) for d in [*cmp_dirs.values(), *seed_dirs.values()]))
    results = {p: write_compare(evals[p[0]], evals[p[1]], d, overwrite=True) for p, d in cmp_dirs.items()}
    seeds = {p: write_compare(",".join(map(str, replicates[p[0]])), ",".join(map(str, replicates[p[1]])), d,
                              overwrite=True) for p, d in seed_dirs.items()}  # pooled over the fine-tune seeds
    gain = context_gain(evals["base"], evals["shortctx"], evals["longctx"],
                        compares=[load_compare_dir(d) for d in cmp_dirs.values()])
    timeline.done(9)
    log.info(f"[10/10] report -> {report}")
    write_report([*evals.values(), *cmp_dirs.values(), *seed_dirs.values()], report, runs=list(runs.values()),
                 overwrite=True, title="genome_lm demo: base vs short- vs long-context fine-tune",
                 matched=(evals["base"], evals["shortctx"], evals["longctx"]))
    timeline.done(10)
    _print_results(r, quick, timeline, manifest, gain, summaries, results, seeds, report)


def _print_results(r, quick: bool, timeline: Timeline, manifest: dict, gain, summaries: dict, results: dict,
                   seeds: dict, report: Path) -> None:
    """What the demo found, on stdout."""
    from genome_lm.eval import format_table
    from genome_lm.eval.text import replicate_lines
    from genome_lm.report import format_ablation, format_context_gain
    from genome_lm.report.matched import PAIRS as ROLE_PAIRS

    print(f"\ngenome_lm demo ({'quick' if quick else 'full'}) finished in "
          f"{(timeline.clock() - timeline.t0) / 60:.1f} min")
    for split, info in manifest["splits"].items():
        print(f"  shards {split:<5}: {info['windows']:>4} windows, {info['tokens']:>10,} tokens "
              f"({', '.join(info['chroms'])})")
    print(format_context_gain(gain))
    if (ablation := format_ablation(gain)) is not None:
        print(ablation)
    print("  both strands (each window also scored as its reverse complement):")
    names = {"base": "base", "shortctx": "short-context fine-tune", "longctx": "long-context fine-tune"}
    for role, name in names.items():
        st = summaries[role]["strands"]
        f, v, g = st["forward"]["overall"], st["reverse"]["overall"], st["agreement"]["overall"]
        print(f"  {name:<24} forward {f['bits_per_base']:.4f}, reverse complement {v['bits_per_base']:.4f} "
              f"bits/base; per-base Pearson r {g['pearson_r']:.3f}")
    leak, n = {k: v["overall"] for k, v in summaries["longctx"]["leakage"].items()}, summaries["longctx"]["overall"]
    bits = {k: "-" if v["bits_per_base"] is None else f"{v['bits_per_base']:.4f}" for k, v in leak.items()}
    print(f"  leakage mask (eval positions in a 32-mer that occurs in chr1/chr2): {leak['masked']['n_tokens']:,} of "
          f"{n['n_tokens']:,} scored tokens; the long-context model scores {bits['unmasked']} bits/base without "
          f"them, {bits['masked']} on them")
    print("  long- vs short-context fine-tune on held-out chr22, by preceding context:")
    print(format_table(results[("shortctx", "longctx")]))
    if seeds:  # the three paired differences of `report.matched.PAIRS`, pooled over the fine-tune seeds
        print(f"  Over fine-tune seeds 1,{r.extra_seeds} (extra_seeds): each paired difference per seed, and pooled "
              "with a 95% CI over seeds, then windows")
        print(f"  {'paired difference, B - A':<33} {'rel % per seed':>24} {'pooled rel %':>13} {'95% CI (%)':>16}")
        for b, a, what in ROLE_PAIRS:
            rep = seeds[(NAMES[a], NAMES[b])]["replicates"]
            per = ", ".join("-" if x["rel_change_pct"] is None else f"{x['rel_change_pct']:+.2f}" for x in rep["pairs"])
            o = rep["overall"]
            ci = "-" if o["rel_ci_low"] is None else f"[{o['rel_ci_low']:+.2f}, {o['rel_ci_high']:+.2f}]"
            print(f"  {f'{b} - {a} ({what})':<33} {per:>24} {o['rel_change_pct']:>+13.2f} {ci:>16}")
        print(f"  long- vs short-context fine-tunes of seeds 1,{r.extra_seeds}, pooled:")
        print("\n".join(replicate_lines(seeds[("shortctx", "longctx")]["replicates"], pooled_above=False)))
    if timeline.reused:
        print(f"  already complete, reused: step{'s' if len(timeline.reused) > 1 else ''} "
              f"{', '.join(map(str, timeline.reused))} of 10")
    print(f"  report: {report}")

