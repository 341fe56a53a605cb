"""The sweep's rows, one list per command (`CASES` joins them): a new command's cases are a new list."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.sweep.table import Case, copy, finished_like, held, running, steps, write

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
GENOME = ">chr1\n" + "ACGT" * 2000 + "\n>chr2\n" + "ACGT" * 2000 + "\n>chr22\n" + "ACGT" * 2000 + "\n"


def _truncate_arrow(split: str):
    def edit(shards: Path) -> None:
        arrow = next((shards / split).glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:-100])
    return edit


def _edit_json(name: str, fn):
    def edit(folder: Path) -> None:
        path = folder / name
        obj = json.loads(path.read_text())
        fn(obj)
        path.write_text(json.dumps(obj))
    return edit


def _p(name, argv, words, **kw):
    return Case("prepare", name, "prepare " + argv, words, **kw)


PREPARE = [
    _p("missing FASTA", "--fasta {tmp}/nope.fa --out {out}", ("nope.fa",)),
    _p("FASTA is a folder", "--fasta {tmp} --out {out}", ("{tmp}",)),
    _p("empty FASTA", "--fasta {tmp}/e.fa --out {out}", ("e.fa",), setup=write("e.fa", "")),
    _p("FASTA without a header", "--fasta {tmp}/x.fa --out {out}", ("x.fa",), setup=write("x.fa", "ACGT\n")),
    _p("binary FASTA", "--fasta {tmp}/x.fa --out {out}", ("x.fa", "binary"), setup=write("x.fa", PNG)),
    _p("invalid characters", "--fasta {tmp}/x.fa --out {out}", ("x.fa",),
       setup=write("x.fa", GENOME.replace("ACGT", "AC*T", 3))),
    _p("record twice", "--fasta {tmp}/x.fa --out {out}", ("chr1",),
       setup=write("x.fa", GENOME + ">chr1\nACGT\n")),
    _p("missing train chromosome", "--fasta {fasta} --train-chroms chrX --out {out}", ("chrX",)),
    _p("missing eval chromosome", "--fasta {fasta} --eval-chroms chr9 --out {out}", ("chr9",)),
    _p("train and eval overlap", "--fasta {fasta} --train-chroms chr1,chr22 --out {out}", ("chr22",)),
    _p("seq-len 0", "--fasta {fasta} --seq-len 0 --out {out}", ("seq-len",)),
    _p("seq-len not a size", "--fasta {fasta} --seq-len abc --out {out}", ("seq-len", "abc")),
    _p("seq-len negative", "--fasta {fasta} --seq-len=-4k --out {out}", ("seq-len",)),
    _p("stride 0", "--fasta {fasta} --stride 0 --out {out}", ("stride",)),
    _p("max-n-frac above 1", "--fasta {fasta} --max-n-frac 1.5 --out {out}", ("max-n-frac",)),
    _p("max-n-frac negative", "--fasta {fasta} --max-n-frac=-0.1 --out {out}", ("max-n-frac",)),
    _p("tail choice", "--fasta {fasta} --tail maybe --out {out}", ("--tail", "maybe")),
    _p("min-len above seq-len", "--fasta {fasta} --seq-len 4k --min-len 8k --out {out}", ("min-len",)),
    _p("leakage-k 33", "--fasta {fasta} --leakage-k 33 --out {out}", ("leakage-k",)),
    _p("leakage-k negative", "--fasta {fasta} --leakage-k=-1 --out {out}", ("leakage-k",)),
    _p("format choice", "--fasta {fasta} --format parquet --out {out}", ("--format", "parquet")),
    _p("out is a file", "--fasta {fasta} --out {tmp}/f", ("{tmp}/f",), setup=write("f", "x")),
    _p("out holds other files", "--fasta {fasta} --out {out} --overwrite", ("{out}",),
       setup=write("out/notes.txt", "x")),
    _p("out exists", "--fasta {fasta} --seq-len 2k --out {tmp}/s", ("already holds shards", "--overwrite"),
       setup=copy("shards", "s")),
    _p("out is an eval", "--fasta {fasta} --out {tmp}/e --overwrite", ("an eval",), setup=copy("ev", "e")),
    _p("out holds the FASTA", "--fasta {tmp}/g/x.fa --out {tmp}/g --overwrite", ("input",),
       setup=write("g/x.fa", GENOME)),
    _p("out is the working directory", "--fasta {fasta} --out . --overwrite", ("working directory",)),
    _p("out empty", "--fasta {fasta} --out ''", ("--out is empty",)),
    _p("out with a literal ~", "--fasta {fasta} --out '~/sh'", ("literal '~'",)),
    _p("config not UTF-8", "--config {tmp}/c.yaml --out {out}", ("c.yaml", "UTF-8"),
       setup=write("c.yaml", b"seq_len: 4k # caf\xe9\n")),
    _p("config key twice", "--config {tmp}/c.yaml --fasta {fasta} --out {out}", ("c.yaml", "twice"),
       setup=write("c.yaml", "seq_len: 4k\nseq_len: 8k\n")),
    _p("config unknown key", "--config {tmp}/c.yaml --fasta {fasta} --out {out}", ("c.yaml", "seqlen"),
       setup=write("c.yaml", "seqlen: 4k\n")),
    _p("config missing", "--config {tmp}/c.yaml --fasta {fasta} --out {out}", ("c.yaml",)),
    _p("config is a list", "--config {tmp}/c.yaml --fasta {fasta} --out {out}", ("c.yaml",),
       setup=write("c.yaml", "- seq_len: 4k\n")),
    _p("set empty value", "--fasta {fasta} --set seq_len= --out {out}", ("seq_len",)),
    _p("set unknown key", "--fasta {fasta} --set seqlen=4k --out {out}", ("--set", "seqlen")),
    _p("set without =", "--fasta {fasta} --set seq_len --out {out}", ("--set", "seq_len")),
    _p("truncated gzip", "--fasta {tmp}/x.fa.gz --out {out}", ("x.fa.gz",),
       setup=copy("fasta", "x.fa.gz", lambda p: p.write_bytes(p.read_bytes()[:20000]))),
    _p("a FASTA given as the config", "--config {fasta} --out {out}", ("genome.fa.gz", "UTF-8")),
    _p("stale .fai", "--fasta {tmp}/x.fa --out {out}", ("x.fa.fai", "delete"),
       setup=steps(write("x.fa", GENOME), write("x.fa.fai", "chr1\t8000\t6\t60\t61\nchr2\t8000\t9000\t60\t61\n"
                                                            "chr22\t8000\t20000\t60\t61\n"))),
    _p("all-N eval chromosome", "--fasta {tmp}/x.fa --seq-len 1k --out {out}", ("chr22", "N"),
       setup=write("x.fa", ">chr1\n" + "ACGT" * 2000 + "\n>chr2\n" + "ACGT" * 2000 + "\n>chr22\n" + "N" * 8000 + "\n")),
    _p("chromosomes shorter than min-len", "--fasta {tmp}/x.fa --seq-len 1M --out {out}", ("seq-len",),
       setup=write("x.fa", GENOME)),
    _p("no splits at all", "--fasta {fasta} --train-chroms '' --eval-chroms '' --out {out}", ("chroms",)),
    _p("same FASTA twice", "--fasta {fasta} --fasta {fasta} --out {out}", ("genome.fa.gz",)),
    _p("another writer holds out", "--fasta {fasta} --out {out}", ("is being written by genome-lm eval (pid {holder}",),
       setup=held("{out}", "eval")),
]


def _c(command):
    return lambda name, argv, words, **kw: Case(command, name, f"{command} {argv}", words, **kw)


_s = _c("synth")
SYNTH = [
    _s("scale 0", "--out {out}.fa.gz --scale 0", ("--scale",)),
    _s("scale negative", "--out {out}.fa.gz --scale=-1", ("--scale",)),
    _s("scale too large", "--out {out}.fa.gz --scale 1e12", ("--scale", "bases")),
    _s("scale nan", "--out {out}.fa.gz --scale nan", ("--scale",)),
    _s("scale inf", "--out {out}.fa.gz --scale inf", ("--scale",)),
    _s("scale not a number", "--out {out}.fa.gz --scale big", ("--scale", "big")),
    _s("seed negative", "--out {out}.fa.gz --seed=-1", ("--seed",)),
    _s("seed not a number", "--out {out}.fa.gz --seed x", ("--seed",)),
    _s("out is a folder", "--out {tmp}", ("{tmp}", "folder")),
    _s("out exists", "--out {tmp}/g.fa.gz", ("already exists", "--overwrite"), setup=copy("fasta", "g.fa.gz")),
    _s("overwrite a FASTA synth did not write", "--out {tmp}/g.fa.gz --overwrite", ("not written by genome-lm synth",),
       setup=write("g.fa.gz", b"\x1f\x8b")),
    _s("parent is a file", "--out {tmp}/f/g.fa.gz", ("{tmp}/f is a file",), setup=write("f", "x")),
    _s("config not UTF-8", "--out {out}.fa.gz --config {tmp}/c.yaml", ("c.yaml", "UTF-8"), setup=write("c.yaml", PNG)),
    _s("config unknown key", "--out {out}.fa.gz --config {tmp}/c.yaml", ("c.yaml", "chroms_count"),
       setup=write("c.yaml", "chroms_count: 3\n")),
    _s("set unknown key", "--out {out}.fa.gz --set gc=0.4", ("--set", "gc")),
    _s("set a bad value", "--out {out}.fa.gz --set segdup_count=many", ("segdup_count",)),
    _s("out empty", "--out ''", ("--out is empty",)),
    _s("another writer holds out", "--out {out}.fa.gz", ("is being written by genome-lm prepare (pid {holder}",),
       setup=held("{out}.fa.gz", "prepare")),
]

_f = _c("fetch")
SRV = "--base-url file://{srv}"
FETCH = [
    _f("unknown chromosome", f"--chroms chrZ --out {{out}} {SRV}", ("chrZ", "md5sum.txt", "--chroms")),
    _f("no chromosomes", f"--chroms '' --out {{out}} {SRV}", ("--chroms",)),
    _f("out is a file", f"--chroms chr22 --out {{tmp}}/f {SRV}", ("{tmp}/f",), setup=write("f", "x")),
    _f("server unreachable", "--chroms chr22 --out {out} --base-url http://127.0.0.1:9", ("127.0.0.1:9", "--base-url")),
    _f("base-url not a URL", "--chroms chr22 --out {out} --base-url nowhere", ("nowhere", "--base-url")),
    _f("base-url a missing folder", "--chroms chr22 --out {out} --base-url file://{tmp}/none", ("{tmp}/none",)),
    _f("server without md5sum.txt", "--chroms chr22 --out {out} --base-url file://{tmp}/s", ("md5sum.txt",),
       setup=write("s/chr22.fa.gz", b"x")),
    _f("md5sum.txt lists no FASTA", "--chroms chr22 --out {out} --base-url file://{tmp}/s",
       ("md5sum.txt", "--base-url"),
       setup=write("s/md5sum.txt", "")),
    _f("server lacks a listed file", "--chroms chr22 --out {out} --base-url file://{tmp}/s", ("chr22.fa.gz",),
       setup=write("s/md5sum.txt", "d41d8cd98f00b204e9800998ecf8427e  chr22.fa.gz\n")),
    _f("wrong md5 on the server", "--chroms chr22 --out {out} --base-url file://{tmp}/s", ("checksum mismatch",),
       setup=steps(copy("fasta", "s/chr22.fa.gz"), write("s/md5sum.txt", "0" * 32 + "  chr22.fa.gz\n"))),
    _f("out with a literal ~", f"--chroms chr22 --out '~/hg' {SRV}", ("literal '~'",)),
    _f("another fetch writes the folder", f"--chroms chr22 --out {{out}} {SRV}",
       ("is being written by genome-lm fetch (pid {holder}",), setup=held("{out}", "fetch", inside=True)),
]


def _rebuilt_shards(ctx) -> None:
    """{tmp}/run, a copy of the world's run, now on {tmp}/s: the other genome's shards, at the path
    its config.yaml names."""
    import shutil

    import yaml

    tmp = Path(ctx["tmp"])
    shutil.copytree(ctx["shards_b"], tmp / "s")
    shutil.copytree(ctx["run"], tmp / "run", symlinks=True)
    for name in ("run/config.yaml", "e.yaml"):
        src = tmp / name if name.startswith("run") else Path(ctx["exp"])
        cfg = yaml.safe_load(src.read_text())
        cfg["data"]["shards"] = str(tmp / "s")
        (tmp / name).write_text(yaml.safe_dump(cfg))


def _same_losses(run: Path, clean: Path) -> bool:
    losses = lambda r: [json.loads(x)["loss"] for x in (r / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    return losses(run) == losses(clean)


def _same_scores(ev: Path, clean: Path) -> bool:
    import numpy as np
    import pyarrow.parquet as pq

    nll = lambda e: np.concatenate(pq.read_table(e / "tokens.parquet").column("nll").to_pylist())  # noqa: E731
    overall = lambda e: json.loads((e / "summary.json").read_text())["overall"]  # noqa: E731
    return np.array_equal(nll(ev), nll(clean), equal_nan=True) and overall(ev) == overall(clean)


_t = _c("train")
EXP_SET = "{exp} --out {out} --set"
TRAIN = [
    _t("experiment missing", "{tmp}/nope.yaml", ("nope.yaml",)),
    _t("experiment is a folder", "{tmp}", ("{tmp}", "folder")),
    _t("experiment not UTF-8", "{tmp}/e.yaml", ("e.yaml", "UTF-8"), setup=write("e.yaml", PNG)),
    _t("experiment key twice", "{tmp}/e.yaml", ("e.yaml", "train", "twice"),
       setup=write("e.yaml", "train:\n  steps: 3\ntrain:\n  lr: 1\n")),
    _t("experiment unknown section", "{tmp}/e.yaml", ("e.yaml", "trian", "did you mean train"),
       setup=write("e.yaml", "trian:\n  steps: 3\n")),
    _t("experiment not YAML", "{tmp}/e.yaml", ("e.yaml", "line"), setup=write("e.yaml", "train: [1\n")),
    _t("experiment empty", "{tmp}/e.yaml", ("e.yaml",), setup=write("e.yaml", "")),
    _t("experiment a list", "{tmp}/e.yaml", ("e.yaml",), setup=write("e.yaml", "- 1\n")),
    _t("lr negative", EXP_SET + " train.lr=-1", ("train.lr",)),
    _t("steps empty", EXP_SET + " train.steps=", ("train.steps", "empty")),
    _t("steps fractional", EXP_SET + " train.steps=1.5", ("train.steps",)),
    _t("micro_batch 0", EXP_SET + " train.micro_batch=0", ("train.micro_batch",)),
    _t("section typo in --set", EXP_SET + " trian.lr=1", ("--set", "trian")),
    _t("learning_rate for lr", EXP_SET + " train.learning_rate=1", ("train.learning_rate", "train.lr")),
    _t("set without =", EXP_SET + " train.lr", ("--set", "train.lr")),
    _t("set value not YAML", EXP_SET + " 'train.betas=[0.9'", ("train.betas",)),
    _t("seq_len not a size", EXP_SET + " data.seq_len=abc", ("data.seq_len", "abc")),
    _t("shards missing", EXP_SET + " data.shards={tmp}/none", ("{tmp}/none",)),
    _t("shards is the FASTA", EXP_SET + " data.shards={fasta}", ("genome.fa.gz",)),
    _t("shards is a run", EXP_SET + " data.shards={run}", ("{run}",)),
    _t("seq_len longer than the windows", EXP_SET + " data.seq_len=8k", ("data.seq_len", "4,096")),
    _t("unknown model preset", EXP_SET + " model.name=glm53-nope", ("glm53-nope",)),
    _t("unknown model override", EXP_SET + " model.overrides.index_top_k=1", ("index_top_k", "index_topk")),
    _t("ep does not divide the experts", EXP_SET + " parallel.ep=3", ("parallel.ep=3", "--dry-run", "routed experts")),
    _t("out is a file", "{exp} --out {tmp}/f", ("{tmp}/f",), setup=write("f", "x")),
    _t("out is an eval", "{exp} --out {tmp}/e", ("an eval", "not a run directory"), setup=copy("ev", "e")),
    _t("out is shards", "{exp} --out {shards}", ("shards", "not a run directory")),
    _t("out is a finished run", "{exp} --out {tmp}/run", ("{tmp}/run", "--resume"), setup=copy("run", "run")),
    _t("resume on rebuilt shards", "{tmp}/e.yaml --out {tmp}/run --resume", ("--resume", "sha256"),
       setup=_rebuilt_shards),
    _t("resume with another lr", "{exp} --out {tmp}/run --resume --set train.lr=5e-3",
       ("--resume", "train.lr"), setup=copy("run", "run")),
    _t("resume without config.yaml", "{exp} --out {tmp}/run --resume", ("config.yaml", "missing"),
       setup=copy("run", "run", lambda p: (p / "config.yaml").unlink())),
    _t("resume with a broken config.yaml", "{exp} --out {tmp}/run --resume", ("config.yaml", "YAML"),
       setup=copy("run", "run", lambda p: (p / "config.yaml").write_text("data: [\n"))),
    _t("resume with its checkpoints removed", "{exp} --out {tmp}/run --resume", ("--resume", "checkpoint"),
       setup=copy("run", "run", lambda p: __import__("shutil").rmtree(p / "checkpoints"))),
    _t("damaged shards", "{exp} --out {out} --set data.shards={tmp}/s", ("damaged", "prepare"),
       setup=copy("shards", "s", _truncate_arrow("train"))),
    _t("edited manifest", "{exp} --out {out} --set data.shards={tmp}/s", ("manifest.json",),
       setup=copy("shards", "s", _edit_json("manifest.json", lambda m: m.update(token_dtype="uint16")))),
    _t("nproc 0", "{exp} --out {out} --nproc 0", ("--nproc",)),
    _t("max-restarts negative", "{exp} --out {out} --max-restarts=-1", ("--max-restarts",)),
    _t("dry run of a cp that does not divide", "{exp} --dry-run --nproc 2 --set parallel.cp=3", ("parallel.cp",)),
    _t("dry run of an ep that does not divide the experts", "{exp} --dry-run --set parallel.ep=3",
       ("parallel.ep=3", "8 routed experts")),
    _t("another writer holds out", "{exp} --out {out}", ("is being written by genome-lm train (pid {holder}",),
       setup=held("{out}", "train")),
    _t("a second training while the first writes", "{exp} --out {out} --set train.lr=1e-3",
       ("is being written by genome-lm train (pid {holder}",), setup=running("train {exp} --out {out}",
                                                                            "{out}/metrics.jsonl"),
       after=finished_like("run", _same_losses)),
]

_e = _c("eval")
EV = "--checkpoint {ckpt} --shards {shards} --out {out} --max-windows 2 --seq-len 512 --resamples 50"
EVAL = [
    _e("checkpoint missing", "--checkpoint {tmp}/none --shards {shards} --out {out}", ("{tmp}/none",)),
    _e("checkpoint is a file", "--checkpoint {exp} --shards {shards} --out {out}", ("exp.yaml",)),
    _e("checkpoint is shards", "--checkpoint {shards} --shards {shards} --out {out}", ("{shards}",)),
    _e("checkpoint is a run folder", "--checkpoint {run} --shards {shards} --out {out}", ("{run}", "checkpoints")),
    _e("shards missing", "--checkpoint {ckpt} --shards {tmp}/none --out {out}", ("{tmp}/none",)),
    _e("shards is a run", "--checkpoint {ckpt} --shards {run} --out {out}", ("{run}",)),
    _e("shards not given", "--checkpoint {ckpt} --out {out}", ("--shards",)),
    _e("unknown split", EV + " --split test", ("test",)),
    _e("seq-len 0", EV + " --seq-len 0", ("--seq-len",)),
    _e("seq-len not a size", EV + " --seq-len abc", ("--seq-len", "abc")),
    _e("max-windows 0", EV + " --max-windows 0", ("--max-windows",)),
    _e("buckets empty", EV + " --buckets ''", ("buckets",)),
    _e("buckets not increasing", EV + " --buckets 16,4,256", ("buckets",)),
    _e("buckets not numbers", EV + " --buckets a,b", ("buckets",)),
    _e("device tpu", EV + " --device tpu", ("tpu",)),
    _e("device cuda without a GPU", EV + " --device cuda", ("cuda",)),
    _e("dtype float8", EV + " --dtype float8", ("float8",)),
    _e("cp 0", EV + " --cp 0", ("--cp",)),
    _e("cp without enough processes", EV + " --cp 2", ("--cp",)),
    _e("engine choice", EV + " --engine warp", ("--engine", "warp")),
    _e("chunk-tokens 0", EV + " --chunk-tokens 0", ("--chunk-tokens",)),
    _e("annotate missing BED", EV + " --annotate {tmp}/x.bed", ("x.bed",)),
    _e("annotate empty BED", EV + " --annotate {tmp}/x.bed", ("x.bed",), setup=write("x.bed", "")),
    _e("annotate BED of another chromosome", EV + " --annotate {tmp}/x.bed", ("x.bed", "chr22"),
       setup=write("x.bed", "chr5\t0\t100\n")),
    _e("annotate malformed BED", EV + " --annotate {tmp}/x.bed", ("x.bed",), setup=write("x.bed", "chr22\tten\t20\n")),
    _e("context longer than the pieces", EV + " --context 4k", ("--context",)),
    _e("context not sizes", EV + " --context a,b", ("--context",)),
    _e("resamples negative", EV + " --resamples=-1", ("--resamples",)),
    _e("strands choice", EV + " --strands sideways", ("--strands", "sideways")),
    _e("out is the shards", "--checkpoint {ckpt} --shards {tmp}/s --out {tmp}/s --overwrite", ("input",),
       setup=copy("shards", "s")),
    _e("out inside the shards", "--checkpoint {ckpt} --shards {tmp}/s --out {tmp}/s/ev", ("lies inside",),
       setup=copy("shards", "s")),
    _e("out exists", "--checkpoint {ckpt} --shards {shards} --out {tmp}/e", ("already exists", "--overwrite"),
       setup=copy("ev", "e")),
    _e("out is a run", "--checkpoint {ckpt} --shards {shards} --out {tmp}/run --overwrite", ("a run directory",),
       setup=copy("run", "run")),
    _e("damaged shards", EV.replace("{shards}", "{tmp}/s"), ("damaged", "prepare"),
       setup=copy("shards", "s", _truncate_arrow("eval"))),
    _e("config not UTF-8", EV + " --config {tmp}/c.yaml", ("c.yaml", "UTF-8"), setup=write("c.yaml", PNG)),
    _e("set unknown key", EV + " --set seqlen=4", ("--set", "seqlen")),
    _e("nproc 0", EV + " --nproc 0", ("--nproc",)),
    _e("ray at an address nothing listens on", EV + " --ray ray://127.0.0.1:9", ("127.0.0.1:9",)),
    _e("another writer holds out", EV, ("is being written by genome-lm eval (pid {holder}",),
       setup=held("{out}", "eval")),
    _e("a second eval while the first writes", EV.replace("{shards}", "{shards_b}") + " --overwrite",
       ("is being written by genome-lm eval (pid {holder}",), setup=running("eval " + EV, "{tmp}/.out.eval-cache"),
       after=finished_like("ev", _same_scores)),
]


def _summary(edit):
    return _edit_json("summary.json", edit)


_k = _c("compare")
COMPARE = [
    _k("A missing", "{tmp}/none {ev} --out {out}", ("{tmp}/none",)),
    _k("B missing", "{ev} {tmp}/none --out {out}", ("{tmp}/none",)),
    _k("A is shards", "{shards} {ev} --out {out}", ("{shards}",)),
    _k("A is a file", "{exp} {ev} --out {out}", ("exp.yaml", "is a file")),
    _k("A is a run", "{run} {ev} --out {out}", ("{run}",)),
    _k("different genomes", "{ev} {ev_b} --out {out}", ("different genomes", "sha256")),
    _k("shards prepared differently", "{ev} {tmp}/e --out {out}", ("prepared differently", "max_n_frac"),
       setup=copy("ev", "e", _summary(lambda s: s["shards"]["parameters"].update(max_n_frac=0.9)))),
    _k("damaged tokens.parquet", "{ev} {tmp}/e --out {out}", ("tokens.parquet", "damaged"),
       setup=copy("ev", "e", lambda p: (p / "tokens.parquet").write_bytes((p / "tokens.parquet").read_bytes()[:-50]))),
    _k("summary.json not JSON", "{ev} {tmp}/e --out {out}", ("summary.json",),
       setup=copy("ev", "e", lambda p: (p / "summary.json").write_text("{"))),
    _k("tokens.parquet missing", "{ev} {tmp}/e --out {out}", ("tokens.parquet",),
       setup=copy("ev", "e", lambda p: (p / "tokens.parquet").unlink())),
    _k("out is A", "{tmp}/e {ev} --out {tmp}/e --overwrite", ("input",), setup=copy("ev", "e")),
    _k("out inside A", "{tmp}/e {ev} --out {tmp}/e/c", ("lies inside",), setup=copy("ev", "e")),
    _k("out exists", "{ev} {ev} --out {tmp}/c", ("already exists", "--overwrite"), setup=copy("cmp", "c")),
    _k("out is an eval", "{ev} {ev} --out {tmp}/e --overwrite", ("an eval",), setup=copy("ev", "e")),
    _k("replicates of unequal count", "{ev},{tmp}/e {ev},{tmp}/e2,{tmp}/e3 --out {out}",
       ("2 replicate evals for A and 3 for B",), setup=steps(copy("ev", "e"), copy("ev", "e2"), copy("ev", "e3"))),
    _k("a replicate twice", "{ev},{ev} {ev},{ev} --out {out}", ("twice",)),
    _k("trailing comma", "{ev}, {ev} --out {out}", ("{ev},", "empty name")),
    _k("two commas", "{ev},,{tmp}/e {ev},{tmp}/e --out {out}", ("empty name",), setup=copy("ev", "e")),
    _k("A empty", "'' {ev} --out {out}", ("eval",)),
    _k("A is a comparison", "{cmp} {ev} --out {out}", ("{cmp}", "summary.json")),
    _k("another writer holds out", "{ev} {ev} --out {out}", ("is being written by genome-lm compare (pid {holder}",),
       setup=held("{out}", "compare")),
]

_r = _c("report")
REPORT = [
    _r("nothing to report", "--out {out}.html", ("eval",)),
    _r("dir missing", "{tmp}/none --out {out}.html", ("{tmp}/none",)),
    _r("dir is shards", "{shards} --out {out}.html", ("{shards}",)),
    _r("dir is a run", "{run} --out {out}.html", ("{run}", "--run")),
    _r("run missing", "--run {tmp}/none --out {out}.html", ("{tmp}/none",)),
    _r("run is an eval", "--run {ev} --out {out}.html", ("{ev}",)),
    _r("run without metrics.jsonl", "--run {tmp}/run --out {out}.html", ("metrics.jsonl",),
       setup=copy("run", "run", lambda p: (p / "metrics.jsonl").unlink())),
    _r("out is a folder", "{ev} --out {tmp}", ("{tmp}", "folder")),
    _r("out exists", "{ev} --out {tmp}/r.html", ("already exists", "--overwrite"), setup=copy("html", "r.html")),
    _r("out inside an eval", "{ev} --out {tmp}/e/r.html", ("inside an eval",), setup=copy("ev", "e")),
    _r("out is a JSON file", "{ev} --out {tmp}/r.json --overwrite", ("r.json",), setup=write("r.json", "{}")),
    _r("damaged summary", "{tmp}/e --out {out}.html", ("summary.json",),
       setup=copy("ev", "e", lambda p: (p / "summary.json").write_text("[]"))),
    _r("evals of different genomes", "{ev} {ev_b} --out {out}.html", ("different genomes",), exit=0),
    _r("out empty", "{ev} --out ''", ("--out is empty",)),
    _r("another writer holds out", "{ev} --out {out}.html", ("is being written by genome-lm report (pid {holder}",),
       setup=held("{out}.html", "report")),
]

_x = _c("export")
EXPORT = [
    _x("checkpoint missing", "{tmp}/none --out {out}", ("{tmp}/none",)),
    _x("checkpoint is a run", "{run} --out {out}", ("{run}", "checkpoints")),
    _x("checkpoint is shards", "{shards} --out {out}", ("{shards}",)),
    _x("checkpoint is a file", "{exp} --out {out}", ("exp.yaml",)),
    _x("out holds other files", "{ckpt} --out {out} --overwrite", ("{out}",), setup=write("out/notes.txt", "x")),
    _x("out inside the checkpoint", "{tmp}/run/checkpoints/last --out {tmp}/run/checkpoints/last/m", ("lies inside",),
       setup=copy("run", "run")),
    _x("max-shard-size 0", "{ckpt} --out {out} --max-shard-size 0", ("--max-shard-size",)),
    _x("max-shard-size not a size", "{ckpt} --out {out} --max-shard-size big", ("--max-shard-size", "big")),
    _x("out is an eval", "{ckpt} --out {tmp}/e --overwrite", ("an eval",), setup=copy("ev", "e")),
    _x("damaged train_state", "{tmp}/run/checkpoints/last --out {out}", ("damaged",),
       setup=copy("run", "run", lambda p: [f.write_bytes(f.read_bytes()[:100]) for f in
                                           (p / "checkpoints" / "last" / "train_state").glob("*.distcp")])),
    _x("out empty", "{ckpt} --out ''", ("--out is empty",)),
    _x("another writer holds out", "{ckpt} --out {out}", ("is being written by genome-lm export (pid {holder}",),
       setup=held("{out}", "export")),
]

FULL = str(Path(__file__).resolve().parents[2] / "experiments" / "glm53flash_1m_64xb200.yaml")
_l = _c("plan")
PLAN = [
    _l("experiment missing", "{tmp}/none.yaml", ("none.yaml",)),
    _l("experiment not UTF-8", "{tmp}/e.yaml", ("e.yaml", "UTF-8"), setup=write("e.yaml", PNG)),
    _l("unknown preset", "--model glm53-nope --seq-len 1M --gpus 8", ("glm53-nope",)),
    _l("preset without seq-len", "--model glm53-tiny --gpus 8", ("--seq-len",)),
    _l("preset without gpus", "--model glm53-tiny --seq-len 1M", ("--gpus",)),
    _l("seq-len not a size", f"{FULL} --seq-len abc", ("--seq-len", "abc")),
    _l("gpus 0", f"{FULL} --gpus 0", ("--gpus",)),
    _l("unknown gpu", f"{FULL} --gpu tpu", ("tpu",)),
    _l("gpu-mem not a size", f"{FULL} --gpu-mem lots", ("--gpu-mem", "lots")),
    _l("host-mem negative", f"{FULL} --host-mem=-1", ("--host-mem",)),
    _l("assume without a value", f"{FULL} --assume matmul_efficiency", ("--assume", "KEY=VALUE")),
    _l("assume an unknown key", f"{FULL} --assume speed=2", ("speed",)),
    _l("cp that does not divide the gpus", f"{FULL} --gpus 8 --cp 3", ("--cp 3", "--gpus 8")),
    _l("ep that does not divide the experts", f"{FULL} --ep 7", ("ep",)),
    _l("set an unknown key", f"{FULL} --set trian.lr=1", ("--set", "trian")),
    _l("fit where nothing fits", f"{FULL} --fit --gpus 8 --gpu h100", ("--fit", "nothing fits")),
]

_h = _c("rehearse")
REHEARSE = [
    _h("gpus not given", f"{FULL}", ("--gpus",)),
    _h("experiment missing", "{tmp}/none.yaml --gpus 8", ("none.yaml",)),
    _h("layers beyond the model", f"{FULL} --gpus 8 --layers 99", ("--layers", "45")),
    _h("layers without recompute", f"{FULL} --gpus 8 --layers 3 --set memory.recompute=none "
       "--set memory.offload_layer_inputs=false",
       ("--layers", "recompute")),
    _h("layers not a number", f"{FULL} --gpus 8 --layers many", ("--layers",)),
    _h("one step", f"{FULL} --gpus 8 --steps 1", ("--steps",)),
    _h("gpus 0", f"{FULL} --gpus 0", ("--gpus",)),
    _h("unknown gpu", f"{FULL} --gpus 8 --gpu tpu", ("tpu",)),
    _h("routing choice", f"{FULL} --gpus 8 --routing random", ("--routing", "random")),
    _h("assume without a value", f"{FULL} --gpus 8 --assume x", ("--assume",)),
    _h("float32 MoE without expert parallelism", f"{FULL} --gpus 8 --set model.dtype=float32 --set parallel.ep=1",
       ("float32", "bfloat16")),
    _h("set an unknown key", f"{FULL} --gpus 8 --set trian.lr=1", ("--set", "trian")),
]

_d = _c("demo")
DEMO = [
    _d("root is a file", "--root {tmp}/f", ("{tmp}/f", "file"), setup=write("f", "x")),
    _d("window not a size", "--root {tmp} --set window=abc", ("window", "abc")),
    _d("context longer than the window", "--root {tmp} --set window=1k --set context=4k", ("context", "window")),
    _d("unknown model", "--root {tmp} --set model=glm53-nope", ("glm53-nope",)),
    _d("unknown recipe key", "--root {tmp} --set speed=2", ("speed",)),
    _d("base_steps 0", "--root {tmp} --set base_steps=0", ("base_steps",)),
    _d("extra_seeds not numbers", "--root {tmp} --set extra_seeds=x", ("extra_seeds",)),
    _d("scale negative", "--root {tmp} --set scale=-1", ("scale",)),
    _d("set without =", "--root {tmp} --set window", ("--set",)),
    _d("root inside shards", "--root {shards}/demo", ("--root", "shards")),
    _d("root inside an eval", "--root {ev}/demo", ("--root", "eval")),
    _d("another writer holds the root", "--root {tmp}/d", ("is being written by genome-lm demo (pid {holder}",),
       setup=held("{tmp}/d", "demo", inside=True)),
]

_o = _c("score")
SC = "--checkpoint {ckpt} --fasta {fasta} --out {out}"
BED = "--regions {tmp}/r.bed"
SCORE = [
    _o("checkpoint missing", "--checkpoint {tmp}/none --fasta {fasta} --out {out}", ("{tmp}/none",)),
    _o("checkpoint is shards", "--checkpoint {shards} --fasta {fasta} --out {out}", ("{shards}",)),
    _o("FASTA missing", "--checkpoint {ckpt} --fasta {tmp}/none.fa --out {out}", ("none.fa",)),
    _o("FASTA is binary", "--checkpoint {ckpt} --fasta {tmp}/x.fa --out {out}", ("x.fa", "binary"),
       setup=write("x.fa", PNG)),
    _o("regions missing", f"{SC} {BED}", ("r.bed",)),
    _o("regions empty", f"{SC} {BED}", ("r.bed",), setup=write("r.bed", "")),
    _o("regions on an unknown chromosome", f"{SC} {BED}", ("chr5", "genome.fa.gz"),
       setup=write("r.bed", "chr5\t0\t100\n")),
    _o("region past the contig's end", f"{SC} {BED}", ("r.bed", "chr22"),
       setup=write("r.bed", "chr22\t0\t999999999\n")),
    _o("region start after its end", f"{SC} {BED}", ("r.bed",), setup=write("r.bed", "chr22\t100\t10\n")),
    _o("region coordinates not numbers", f"{SC} {BED}", ("r.bed",), setup=write("r.bed", "chr22\tten\t20\n")),
    _o("chunk not a multiple of 64", f"{SC} --chunk 100", ("--chunk", "64")),
    _o("chunk 0", f"{SC} --chunk 0", ("--chunk",)),
    _o("strands choice", f"{SC} --strands up", ("--strands", "up")),
    _o("embeddings not layers", f"{SC} --embeddings x", ("--embeddings",)),
    _o("embeddings past the last layer", f"{SC} --embeddings 99", ("--embeddings", "99")),
    _o("pool not a stride", f"{SC} --pool median", ("--pool", "median")),
    _o("device tpu", f"{SC} --device tpu", ("tpu",)),
    _o("dtype choice", f"{SC} --dtype float8", ("--dtype", "float8")),
    _o("cp without enough processes", f"{SC} --cp 2", ("--cp 2", "--nproc 2")),
    _o("out is an eval", "--checkpoint {ckpt} --fasta {fasta} --out {tmp}/e --overwrite", ("an eval",),
       setup=copy("ev", "e")),
    _o("out holds the FASTA", "--checkpoint {ckpt} --fasta {tmp}/g/x.fa --out {tmp}/g --overwrite", ("input",),
       setup=write("g/x.fa", GENOME)),
    _o("config not UTF-8", f"{SC} --config {{tmp}}/c.yaml", ("c.yaml", "UTF-8"), setup=write("c.yaml", PNG)),
    _o("set unknown key", f"{SC} --set strand=both", ("--set", "strand")),
    _o("another writer holds out", SC, ("is being written by genome-lm score (pid {holder}",),
       setup=held("{out}", "score")),
]

_v = _c("variants")
VA = "--checkpoint {ckpt} --fasta {fasta} --vcf {tmp}/v.vcf --contexts 1k --out {out}"
VCF_HEAD = "##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
VCF_ROW = "chr22\t{}\t.\tACGTACGTAC\tA\t.\t.\tLABEL=1\n"


def _snv_on_chr22(ctx: dict) -> None:
    """v.vcf: one SNV whose REF matches chr22 of the world's genome (its first base that is not N)."""
    from genome_lm.genome.fasta import Reference

    tokens = Reference.load(ctx["fasta"], ["chr22"]).tokens("chr22")
    i = int((tokens < 4).argmax())
    ref, alt = "ACGT"[tokens[i]], "ACGT"[(tokens[i] + 1) % 4]
    Path(ctx["tmp"], "v.vcf").write_text(VCF_HEAD + f"chr22\t{i + 1}\t.\t{ref}\t{alt}\t.\t.\t.\n")


VARIANTS = [
    _v("VCF missing", VA, ("v.vcf",)),
    _v("VCF is binary", VA, ("v.vcf",), setup=write("v.vcf", PNG)),
    _v("VCF without a header", VA, ("#CHROM",), setup=write("v.vcf", VCF_ROW.format(100))),
    _v("VCF unsorted", VA, ("not sorted", "bcftools sort"),
       setup=write("v.vcf", VCF_HEAD + VCF_ROW.format(300) + VCF_ROW.format(100))),
    _v("VCF gzip cut short", VA.replace("v.vcf", "v.vcf.gz"), ("v.vcf.gz", "gzip"),
       setup=write("v.vcf.gz", gzip.compress((VCF_HEAD + VCF_ROW.format(100) * 50).encode())[:60])),
    _v("VCF record not tab-separated", VA, ("v.vcf", "line 3"), setup=write("v.vcf", VCF_HEAD + "chr22 100 . A C\n")),
    _v("REF alleles of another assembly", VA, ("REF alleles differ", "liftOver"),
       setup=write("v.vcf", VCF_HEAD + VCF_ROW.format(100) + VCF_ROW.format(200) + VCF_ROW.format(300))),
    _v("contexts longer than every contig", VA.replace("1k", "100m"), ("--contexts",), setup=_snv_on_chr22),
    _v("contexts not sizes", VA.replace("1k", "abc"), ("--contexts", "abc")),
    _v("labels and labels-tsv", f"{VA} --labels LABEL --labels-tsv {{tmp}}/l.tsv", ("--labels", "--labels-tsv"),
       setup=write("l.tsv", "")),
    _v("after negative", f"{VA} --after -1", ("--after",)),
    _v("strands reverse", f"{VA} --strands reverse", ("--strands", "reverse")),
    _v("out is an eval", VA.replace("{out}", "{tmp}/e --overwrite"), ("an eval",), setup=copy("ev", "e")),
    _v("another writer holds out", VA, ("is being written by genome-lm variants (pid {holder}",),
       setup=held("{out}", "variants")),
]

_u = _c("check-upstream")
CHECK_UPSTREAM = [
    _u("an argument", "extra", ("unrecognized arguments", "extra")),
    _u("an unknown flag", "--out x", ("unrecognized arguments", "--out")),
]

UNKNOWN_FLAG = [Case(c, "an unknown flag", f"{c} {args}--bogus", ("unrecognized arguments", "--bogus"))
                for c, args in (("prepare", ""), ("synth", ""), ("fetch", ""), ("train", "{exp} "), ("eval", ""),
                                ("compare", "{ev} {ev} "), ("report", ""), ("export", "{ckpt} "), ("plan", ""),
                                ("rehearse", "{exp} "), ("demo", ""), ("score", ""), ("variants", ""))]

CASES = [*UNKNOWN_FLAG, *PREPARE, *SYNTH, *FETCH, *TRAIN, *EVAL, *COMPARE, *REPORT, *EXPORT, *PLAN, *REHEARSE, *DEMO,
         *SCORE, *VARIANTS, *CHECK_UPSTREAM]
