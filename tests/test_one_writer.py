"""One writer per output: a command holds `.NAME.lock` beside its output while it writes, a second
command into the same output is refused in one line naming the holder, and the first one's result
is what a clean run gives. A lock whose holder is gone is taken over with a warning."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.outputs import claim_output, holding, lock_file
from tests.eval.data import N_WINDOWS
from tests.helpers import write_experiment

# The CLI in a child process whose steps (eval: each scoring round) take at least `seconds`.
SLOW = ("import sys, time; from genome_lm.parallel import callbacks; from genome_lm.cli import main; "
        "callbacks.install(lambda *a: time.sleep(float(sys.argv[1]))); sys.exit(main(sys.argv[2:]))")


def slow_cli(seconds: float, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLOW, str(seconds), *argv], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TQDM_DISABLE": "1"})


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() - t0 < timeout, f"{path} did not appear"
        time.sleep(0.2)


def refused_by(capsys, argv: list[str], pid: int, command: str) -> None:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"is being written by genome-lm {command} (pid {pid} on {socket.gethostname()}, started " in lines[0], \
        lines[0]


def test_second_eval_into_the_same_out_is_refused_and_the_first_is_clean(evaluated, tmp_path, capsys):
    out = tmp_path / "ev"
    args = ["--shards", str(evaluated.shards), "--out", str(out), "--max-windows", str(N_WINDOWS),
            "--resamples", "500"]
    first = slow_cli(2.0, "eval", "--checkpoint", str(evaluated.ckpt0), *args)
    wait_for(out.parent / ".ev.eval-cache", first)  # it has scored a window
    refused_by(capsys, ["eval", "--checkpoint", str(evaluated.ckpt1), *args], first.pid, "eval")
    refused_by(capsys, ["eval", "--checkpoint", str(evaluated.ckpt1), *args, "--overwrite"], first.pid, "eval")
    assert first.wait(timeout=300) == 0, first.communicate()[1]
    got = pq.read_table(out / "tokens.parquet").column("nll").to_pylist()
    clean = pq.read_table(evaluated.eval0 / "tokens.parquet").column("nll").to_pylist()
    assert np.array_equal(np.concatenate(got), np.concatenate(clean), equal_nan=True)
    overall = lambda d: json.loads((d / "summary.json").read_text())["overall"]  # noqa: E731
    assert overall(out) == overall(evaluated.eval0)
    assert not lock_file(out).exists()


def test_second_training_into_the_same_out_is_refused(tiny_shards, tmp_path, capsys):
    exp = write_experiment(tmp_path / "exp.yaml", tiny_shards)
    out = tmp_path / "run"
    first = slow_cli(1.0, "train", exp, "--out", str(out))
    wait_for(out / "metrics.jsonl", first)
    refused_by(capsys, ["train", exp, "--out", str(out), "--set", "train.lr=1e-3"], first.pid, "train")
    assert first.wait(timeout=300) == 0, first.communicate()[1]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert "lr: 0.003" in (out / "config.yaml").read_text()


def test_a_second_fetch_into_the_same_folder_is_refused(tmp_path, capsys):
    import hashlib

    srv, out = tmp_path / "srv", tmp_path / "hg38"
    srv.mkdir()
    (srv / "chr22.fa.gz").write_bytes(b"chr22")
    (srv / "md5sum.txt").write_text(f"{hashlib.md5(b'chr22').hexdigest()}  chr22.fa.gz\n")
    argv = ["fetch", "--chroms", "chr22", "--out", str(out), "--base-url", f"file://{srv}"]
    hold = ("import sys, time; from genome_lm.outputs import lock_output; lock_output(sys.argv[1], 'fetch', "
            "inside=True); print(flush=True); time.sleep(600)")
    first = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        first.stdout.readline()  # it holds the folder's lock
        refused_by(capsys, argv, first.pid, "fetch")
        assert not (out / "chr22.fa.gz").exists() and not list(out.glob("*.part"))
    finally:
        first.kill()
        first.wait()
    assert main(argv) == 0 and (out / "chr22.fa.gz").read_bytes() == b"chr22"
    assert sorted(p.name for p in out.iterdir()) == ["chr22.fa.gz"]


def test_a_lock_whose_holder_is_gone_is_taken_over_with_a_warning(tmp_path, caplog):
    out = tmp_path / "ev"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {"command": "eval", "pid": int(dead.stdout), "host": socket.gethostname(), "started": "earlier"}
    lock_file(out).write_text(json.dumps(holder))
    with holding(out, "eval"):
        claim_output(out, "eval")
        assert json.loads(lock_file(out).read_text())["pid"] == os.getpid()
    assert f"taking over the lock of genome-lm eval (pid {holder['pid']}" in caplog.text
    assert not lock_file(out).exists()


def test_a_lock_of_another_node_is_refused_naming_the_file(tmp_path):
    out = tmp_path / "ev"
    lock_file(out).write_text(json.dumps({"command": "train", "pid": 1, "host": "node-7", "started": "then"}))
    with pytest.raises(GenomeLMError, match=r"locked by genome-lm train \(pid 1 on node-7, .* on another node; if "
                                            r"that process is gone, remove .*\.ev\.lock"):
        claim_output(out, "eval")


def _copy_eval(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    summary = json.loads((dst / "summary.json").read_text())
    edit(summary["shards"])
    (dst / "summary.json").write_text(json.dumps(summary))
    return dst


def test_compare_refuses_evals_of_different_genomes_or_shard_parameters(evaluated, tmp_path):
    from genome_lm.eval import compare_evals

    other = _copy_eval(evaluated.eval1, tmp_path / "other", lambda s: s["genome"][0].update(sha256="f" * 64))
    with pytest.raises(GenomeLMError, match=r"scored different genomes \(genome.fa.gz sha256 [0-9a-f]{12} vs "
                                            r"genome.fa.gz sha256 ffffffffffff\)"):
        compare_evals(evaluated.eval0, other)
    params = _copy_eval(evaluated.eval1, tmp_path / "params", lambda s: s["parameters"].update(max_n_frac=0.9))
    with pytest.raises(GenomeLMError, match=r"scored shards prepared differently \(max_n_frac: .* vs 0.9\)"):
        compare_evals(evaluated.eval0, params)


def test_compare_says_how_many_tokens_it_leaves_out_and_why(evaluated, tmp_path, caplog):
    from genome_lm.eval import EvalConfig, compare_evals, evaluate

    short = evaluate(EvalConfig(checkpoint=str(evaluated.ckpt1), shards=str(evaluated.shards), out=str(tmp_path / "s"),
                                max_windows=N_WINDOWS, resamples=50, seq_len=512), show_progress=False)
    result = compare_evals(evaluated.eval0, tmp_path / "s", resamples=50)
    a = json.loads((evaluated.eval0 / "summary.json").read_text())["overall"]["n_tokens"]
    assert result["dropped_tokens"]["a"] == a - short["overall"]["n_tokens"] > 0
    assert result["dropped_tokens"]["b"] == 0
    assert f"compare: {result['dropped_tokens']['a']} tokens of A and 0 of B are left out" in caplog.text
    assert "seq_len differ (1024 vs 512)" in caplog.text


def test_report_says_when_its_evals_come_from_different_shards(evaluated, tmp_path):
    from genome_lm.report import build_report

    other = _copy_eval(evaluated.eval1, tmp_path / "other", lambda s: s.update(manifest_sha256="e" * 64))
    assert "These evals scored different shards" in build_report([evaluated.eval0, other])
    assert "These evals scored different shards" not in build_report([evaluated.eval0, evaluated.eval1])


def test_synth_overwrite_refuses_a_fasta_it_did_not_write(tmp_path, capsys):
    real = tmp_path / "real.fa.gz"
    with gzip.open(real, "wb") as f:
        f.write(b">chr1\nACGT\n")
    before = real.read_bytes()
    assert main(["synth", "--out", str(real), "--overwrite", "--scale", "0.01"]) == 2
    assert "was not written by genome-lm synth" in capsys.readouterr().err
    assert real.read_bytes() == before
    assert main(["synth", "--out", str(tmp_path / "s.fa.gz"), "--scale", "0.01"]) == 0
    assert main(["synth", "--out", str(tmp_path / "s.fa.gz"), "--scale", "0.01", "--overwrite"]) == 0


def test_sigterm_stops_a_command_in_one_line(tmp_path, monkeypatch, capsys):
    import genome_lm.cli as cli

    monkeypatch.setitem(cli.COMMANDS, "synth", dataclasses.replace(
        cli.COMMANDS["synth"], run=lambda *params: os.kill(os.getpid(), signal.SIGTERM)))
    assert main(["synth", "--out", str(tmp_path / "s.fa.gz")]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip().splitlines() == ["genome-lm synth: terminated (SIGTERM)"]


def test_a_killed_writers_partial_folder_is_removed_by_the_next_one(tmp_path):
    from genome_lm.outputs import atomic_directory

    stale = tmp_path / ".out.partial-abc"
    stale.mkdir()
    (stale / "x").write_text("half")
    with atomic_directory(tmp_path / "out", "compare") as tmp:
        (tmp / "compare.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _shard_files(shards: Path) -> dict[str, bytes]:
    """Every file of a shards folder, the manifest without its creation time and checksum."""
    files = {str(p.relative_to(shards)): p.read_bytes() for p in sorted(shards.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    files["manifest.json"] = json.dumps({k: v for k, v in manifest.items() if k not in ("created_at", "checksum")})
    return files


def test_sigterm_during_prepare_leaves_nothing_and_a_rerun_gives_a_clean_runs_shards(tmp_path):
    """A real `genome-lm prepare` killed with SIGTERM while it writes its shards: exit 143, one line
    after its progress log and no traceback, no partial folder and no --out; the rerun's shards equal
    those of an uninterrupted prepare."""
    fasta = tmp_path / "g.fa.gz"
    assert main(["synth", "--out", str(fasta), "--scale", "2"]) == 0
    argv = [sys.executable, "-m", "genome_lm.cli", "prepare", "--fasta", str(fasta), "--seq-len", "4k",
            "--reverse-complement", "--leakage-k", "32", "--out"]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    proc = subprocess.Popen([*argv, str(tmp_path / "sh")], stderr=subprocess.PIPE, text=True, env=env)
    while not list(tmp_path.glob(".sh.partial-*/train")):  # its first split is being written
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = err.strip().splitlines()
    assert lines[-1] == "genome-lm prepare: terminated (SIGTERM)", err
    assert all(" INFO genome_lm." in line for line in lines[:-1]), err  # its progress log, nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.fa.gz", "g.repeats.tsv"]
    for out in ("sh", "clean"):
        subprocess.run([*argv, str(tmp_path / out)], check=True, env=env, capture_output=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean", "g.fa.gz", "g.repeats.tsv", "sh"]
    assert _shard_files(tmp_path / "sh") == _shard_files(tmp_path / "clean")
