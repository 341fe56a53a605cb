"""README.md's recipes run as written: "Real data on hg38" (fetch -> prepare -> train -> eval ->
compare -> report) and "On a GPU cluster" (plan, dry runs, the Ray / torchrun / SLURM launches), on a
small genome served by a local HTTP server, with a tiny model.

Only what the README names as test substitutions differs from what a user copies (`SUBSTITUTIONS`
below): the fetch `--base-url`, sizes (`--seq-len`, and `--set` for a tiny model and a few steps),
`$GLM53_FLASH_DIR` (a tiny model directory), and the launchers: the cluster recipe's `--ray auto`
launch runs under Ray Train on a local Ray instance with one CPU worker, the hg38 recipe's `--ray
auto` commands as one process each, torchrun as 2 CPU processes on this machine, and SLURM's `srun`
line must launch exactly the torchrun line's command. Paths are not substituted: a step that reads
what no earlier step wrote fails here as it would for a user.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from genome_lm.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
WINDOW = "1k"  # for --seq-len 512k
SHORT = 128  # for a control's 4k context
SUBSTITUTIONS = """--base-url (fetch), --seq-len and --set (sizes), $GLM53_FLASH_DIR (a tiny model),
--ray auto (a local Ray instance with one CPU worker, or one process), torchrun (2 CPU processes),
srun (checked against the torchrun line)"""
TINY = ["model.name=glm53-tiny", "model.dtype=float32", "train.steps=2", "parallel.cp=1", "parallel.dp=auto",
        "parallel.ep=1", "memory.offload_layer_inputs=false", "memory.kda_head_block=0", "log.wandb=disabled"]


def blocks(section: str, text: str | None = None) -> list[str]:
    """The commands of the ```-fenced blocks under `## SECTION` (continuation lines joined, comments and
    blank lines dropped)."""
    text = README.read_text() if text is None else text
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```\n(.*?)```", body, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def random_chrom(rng, n: int) -> str:
    seq = rng.choice(list("ACGT"), n)
    seq[: n // 50] = "N"  # a telomere-like run of N
    return "".join(seq)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """A UCSC-like folder of chr1, chr2, chr22 .fa.gz and md5sum.txt on a local HTTP server -> base URL."""
    root = tmp_path_factory.mktemp("mirror")
    rng = np.random.default_rng(0)
    sums = []
    for name, n in (("chr1", 12_000), ("chr2", 10_000), ("chr22", 8_000)):
        seq = random_chrom(rng, n)
        data = gzip.compress(f">{name}\n".encode() + "\n".join(seq[i:i + 60] for i in range(0, n, 60)).encode()
                             + b"\n", mtime=0)
        (root / f"{name}.fa.gz").write_bytes(data)
        sums.append(f"{hashlib.md5(data).hexdigest()}  {name}.fa.gz\n")
    (root / "md5sum.txt").write_text("".join(sums))

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def flash_dir(tmp_path_factory):
    """A tiny model directory where the README has the GLM-5.3-Flash download."""
    from genome_lm.model.weights.writer import save_pretrained
    from tests.helpers import tiny_model

    return save_pretrained(tiny_model(), tmp_path_factory.mktemp("flash") / "GLM-5.3-Flash")


def as_tested(command: str, mirror: str, flash: Path, ray: bool = False) -> list[str]:
    """One README command with the documented substitutions applied -> argv (`genome-lm ...` without
    the program name, or a torchrun command line). `ray`: `--ray auto` becomes a local Ray instance
    with one CPU worker; otherwise the command runs as one process (`--ray` and `--cp` dropped)."""
    argv = shlex.split(command.replace("$GLM53_FLASH_DIR", str(flash)))
    assert argv[0] == "genome-lm", command
    argv = argv[1:]
    if argv[0] == "fetch":
        argv += ["--base-url", mirror]
    if "--seq-len" in argv and argv[0] == "prepare":
        i = argv.index("--seq-len")
        assert argv[i + 1] == "512k", command  # the window the whole recipe uses
        argv[i + 1] = WINDOW
    if "--ray" in argv and ray:  # Ray Train here too, on a local instance (no address) with one CPU worker
        i = argv.index("--ray")
        assert argv[i + 1] == "auto", command  # the README's address: the cluster the command runs on
        argv[i:i + 2] = ["--ray", "--nproc", "1"]
    elif "--ray" in argv:  # one process here
        i = argv.index("--ray")
        del argv[i:i + 2]
        if "--cp" in argv:
            i = argv.index("--cp")
            del argv[i:i + 2]
    if argv[0] == "train":
        argv += sized(argv[1])
    return argv


def sized(experiment: str) -> list[str]:
    """`--set`s that make an experiment of the README tiny (its context scaled down in proportion)."""
    from genome_lm.config import load_experiment

    seq_len = load_experiment(experiment).data.seq_len
    small = WINDOW if seq_len >= 2**19 else str(SHORT)
    return [x for s in [*TINY, f"data.seq_len={small}"] for x in ("--set", s)]


def run_all(commands: list[str], cwd: Path, mirror: str, flash: Path, monkeypatch, capsys, ray=False) -> list[str]:
    """Run `commands` in `cwd`, which stands for the checkout (its experiments/ are there); their stdout."""
    if not (cwd / "experiments").exists():
        (cwd / "experiments").symlink_to(README.parent / "experiments")
    monkeypatch.chdir(cwd)
    printed = []
    for command in commands:
        if command.startswith("export "):
            name, _, _ = command.removeprefix("export ").partition("=")
            assert name == "GLM53_FLASH_DIR", command  # the one variable the recipe sets
            continue
        argv = as_tested(command, mirror, flash, ray)
        code = main(argv)
        out = capsys.readouterr()
        assert code == 0, f"{command}\n  ran as: genome-lm {shlex.join(argv)}\n{out.err[-3000:]}"
        printed.append(out.out)
    return printed


@pytest.fixture
def env(monkeypatch, flash_dir):
    monkeypatch.setenv("GLM53_FLASH_DIR", str(flash_dir))
    monkeypatch.setenv("WANDB_MODE", "disabled")


def test_the_hg38_recipe_runs_as_written(env, mirror, flash_dir, tmp_path, monkeypatch, capsys):
    commands = blocks("Real data on hg38")
    assert [c.split()[1] for c in commands if c.startswith("genome-lm")] == [
        "fetch", "prepare", "train", "train", "eval", "eval", "eval", "compare", "report"]
    run_all(commands, tmp_path, mirror, flash_dir, monkeypatch, capsys)
    assert sorted(p.name for p in (tmp_path / "data" / "hg38").iterdir()) == ["chr1.fa.gz", "chr2.fa.gz",
                                                                             "chr22.fa.gz"]
    html = next((tmp_path / "reports").glob("*.html")).read_text()
    assert "Is the gain from context, or from more training?" in html  # base, short and long were found
    assert "long - short" in html or "long &minus; short" in html or "long − short" in html


def test_the_cluster_recipe_runs_as_written(env, mirror, flash_dir, tmp_path, monkeypatch, capsys):
    """plan and the dry runs as written; each launch once, in a folder of its own holding the shards."""
    commands = blocks("On a GPU cluster")
    hg38 = tmp_path / "hg38"
    hg38.mkdir()
    run_all(blocks("Real data on hg38")[:2], hg38, mirror, flash_dir, monkeypatch, capsys)  # fetch, prepare
    launches = [c for c in commands if (" train " in c and "--dry-run" not in c) or c.startswith(("torchrun", "srun"))]
    checks = [c for c in commands if c not in launches]
    assert len(launches) == 3 and [c.split()[0] for c in launches] == ["genome-lm", "torchrun", "srun"]
    printed = run_all(checks, hg38, mirror, flash_dir, monkeypatch, capsys)
    assert any("peak" in p.lower() for p in printed)  # the planner's verdict

    torchrun_line, srun_line = launches[1], launches[2]
    launched = torchrun_line.split(" -m genome_lm ", 1)[1]
    assert srun_line.split(" -m genome_lm ", 1)[1] == launched  # SLURM starts the same command
    for flag in ("--nnodes 8", "--nproc-per-node 8", "--rdzv-backend c10d"):
        assert flag in torchrun_line and flag in srun_line, flag
    assert "--ntasks-per-node 1" in srun_line  # one torchrun per node

    assert "--ray auto" in launches[0]
    for i, launch in enumerate([launches[0], f"genome-lm {launched}"]):
        where = tmp_path / f"launch{i}"
        (where / "shards").mkdir(parents=True)
        (where / "shards" / "hg38_512k").symlink_to(hg38 / "shards" / "hg38_512k")
        (where / "experiments").symlink_to(README.parent / "experiments")
        monkeypatch.chdir(where)
        argv = as_tested(launch, mirror, flash_dir, ray=i == 0)
        if i == 0:  # Ray Train as the README has it, on a local instance with one CPU worker
            ray = pytest.importorskip("ray")
            try:
                run_all([launch], where, mirror, flash_dir, monkeypatch, capsys, ray=True)
            finally:
                ray.shutdown()
        else:  # torchrun as the README has it, on 2 local CPU processes instead of 8 nodes x 8 GPUs
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "genome_lm", *argv]
            done = subprocess.run(torchrun, cwd=where, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            assert done.returncode == 0, done.stderr[-3000:]
        run_dir = where / argv[argv.index("--out") + 1]
        assert_trained(run_dir, hg38 / "shards" / "hg38_512k", world=1 if i == 0 else 2)
        assert (run_dir / "ray").is_dir() == (i == 0)  # Ray Train ran the first launch, and only it
        shutil.rmtree(where)


def assert_trained(run_dir: Path, shards: Path, world: int) -> None:
    """`run_dir` holds a finished run of the README's experiment: every step of `train.steps` once with a
    finite loss on `world` processes, on `shards`' windows, and its last checkpoint is that of the
    last step, complete."""
    import json
    import math

    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    steps = config["train"]["steps"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1)), records
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records), records
    assert Path(config["data"]["shards"]).resolve() == shards.resolve()
    last = (run_dir / "checkpoints" / "last").resolve()
    assert last.name == f"step_{steps:08d}" and (last / "train_state" / ".metadata").is_file(), last
    meta = json.loads((last / "genome_lm.json").read_text())
    assert (meta["step"], meta["world_size"]) == (steps, world), meta


def test_a_recipe_that_reads_what_nothing_wrote_fails(env, mirror, flash_dir, tmp_path, monkeypatch, capsys):
    """The check above would catch shards written under one name and read under another."""
    text = README.read_text().replace("--leakage-k 32 --out shards/hg38_512k", "--leakage-k 32 --out shards/hg38_1m")
    commands = blocks("Real data on hg38", text)
    with pytest.raises(AssertionError, match="shards/hg38_512k"):
        run_all(commands, tmp_path, mirror, flash_dir, monkeypatch, capsys)


def test_the_readme_is_short_and_in_the_documented_order():
    """At most 10,000 characters, sections in reading order, every docs/ page in its index, and README plus
    docs/*.md at most 120,000 bytes (`wc -c README.md docs/*.md`)."""
    text = README.read_text()
    assert len(text) <= 10_000, f"README.md has {len(text):,} characters"
    sizes = {p.name: p.stat().st_size for p in [README, *(README.parent / "docs").glob("*.md")]}
    assert sum(sizes.values()) <= 120_000, f"README.md and docs/*.md have {sum(sizes.values()):,} bytes: {sizes}"
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections == ["Install", "Quick start", "Real data on hg38", "On a GPU cluster", "Commands", "Documentation"]
    docs = README.parent / "docs"
    unlisted = [p.name for p in sorted(docs.glob("*.md")) if f"(docs/{p.name})" not in text]
    assert not unlisted, f"docs/ pages missing from README.md's index: {unlisted}"



def anchors(md: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lowercase, punctuation but `-` dropped, spaces -> `-`."""
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(md: Path) -> list[str]:
    """`(target)` of each relative link of `md` whose file or #anchor does not exist."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", md.read_text(), flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(f"({target})")
    return broken


def test_every_link_of_the_docs_resolves(tmp_path):
    pages = [README, *sorted((README.parent / "docs").glob("*.md"))]
    broken = [f"{page.name}: {b}" for page in pages for b in broken_links(page)]
    assert not broken, "links to a missing file or heading:\n" + "\n".join(broken)
    page = tmp_path / "x.md"  # the check finds a missing heading and a missing file, and only those
    page.write_text("# Top: the `x` page\n[a](#top-the-x-page) [b](#nowhere) [c](missing.md) [d](https://e.org)\n")
    assert broken_links(page) == ["(#nowhere)", "(missing.md)"]
