"""A full disk and a read-only folder are one line from every command that writes, and leave no
output that looks whole. The folders are small tmpfs mounts: as root, in this process; otherwise
`test_the_mount_cases_as_root_of_a_user_namespace` runs this file again as root of a user namespace
(`unshare --map-root-user --mount`), where mounting a tmpfs is allowed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from genome_lm.cli import main


@pytest.fixture
def mount(tmp_path):
    """mount(size, read_only) -> a fresh tmpfs folder under tmp_path; unmounted afterwards."""
    mounted = []

    def make(size: str = "64k", read_only: bool = False) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        if os.geteuid():
            pytest.skip("mounting a tmpfs needs root: test_the_mount_cases_as_root_of_a_user_namespace runs this")
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True, capture_output=True)
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "--lazy", str(where)], check=False)  # detached even while a file there is open


def test_the_mount_cases_as_root_of_a_user_namespace(tmp_path):
    """Without root, every case of this file that mounts a tmpfs runs (and passes) in a user namespace."""
    if not os.geteuid():
        pytest.skip("root: the cases mount their tmpfs in this process")
    proc = subprocess.run(["unshare", "--map-root-user", "--mount", sys.executable, "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'namespace'}", "-k", "not as_root_of",
                           __file__],
                          capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=1800)
    assert proc.returncode == 0 and " passed" in proc.stdout and "skipped" not in proc.stdout, \
        proc.stdout[-3000:] + proc.stderr[-2000:]


def one_line(capsys, code: int) -> str:
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_prepare_on_a_full_disk(eval_inputs, mount, capsys):
    disk = mount("64k")
    line = one_line(capsys, main(["prepare", "--fasta", str(eval_inputs.root / "genome.fa.gz"), "--out",
                                  str(disk / "shards"), "--seq-len", "1k", "--min-len", "256",
                                  "--train-chroms", "chr1"]))
    assert "no space left on the device writing " in line and "free space there or choose another --out" in line
    assert f"writing under --out {disk / 'shards'}" in line or f"writing {disk}/" in line  # the file, else --out
    assert list(disk.iterdir()) == []  # the partial folder is gone


def test_eval_on_a_full_disk_and_a_read_only_folder(eval_inputs, mount, capsys):
    args = ["eval", "--checkpoint", str(eval_inputs.ckpt0), "--shards", str(eval_inputs.shards), "--max-windows", "3",
            "--resamples", "50"]
    disk = mount("16k")
    line = one_line(capsys, main([*args, "--out", str(disk / "ev")]))
    assert "no space left on the device" in line
    assert not (disk / "ev").exists()
    read_only = mount(read_only=True)
    line = one_line(capsys, main([*args, "--out", str(read_only / "ev")]))
    assert "read-only" in line and f"writing {read_only}/" in line


def test_train_on_a_full_disk(tiny_shards, tmp_path, mount, capsys):
    from tests.helpers import write_experiment

    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2, "checkpoint_every": 1})
    disk = mount("256k")
    line = one_line(capsys, main(["train", exp, "--out", str(disk / "run")]))
    # the free-space check before the first save says so; nothing to resume, nothing kept
    assert "checkpoint step 1 needs about" in line and "stopped (train.on_disk_full: stop)" in line
    assert not (disk / "run").exists()


@pytest.mark.parametrize("damaged,expected", [("tokens.parquet", "tokens.parquet is damaged"),
                                              ("summary.json", "summary.json is damaged")])
def test_compare_of_a_damaged_eval_is_one_line(evaluated, tmp_path, capsys, damaged, expected):
    import shutil

    a = tmp_path / "A"
    shutil.copytree(evaluated.eval0, a)
    path = a / damaged
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    line = one_line(capsys, main(["compare", str(a), str(evaluated.eval1), "--out", str(tmp_path / "cmp")]))
    assert expected in line and "rebuild it with `genome-lm eval` and --overwrite" in line
    assert not (tmp_path / "cmp").exists()


def test_an_empty_folder_is_taken_and_a_mount_point_is_refused(eval_inputs, tmp_path, mount, capsys):
    args = ["prepare", "--fasta", str(eval_inputs.root / "genome.fa.gz"), "--seq-len", "1k", "--min-len", "256",
            "--train-chroms", "chr1"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*args, "--out", str(empty)]) == 0  # an empty folder needs no --overwrite
    assert (empty / "manifest.json").is_file()
    point = mount("1m")
    for extra in ([], ["--overwrite"]):
        line = one_line(capsys, main([*args, "--out", str(point), *extra]))
        assert line.endswith(f"--out {point} is a mount point; an output is built beside it and renamed into place, "
                             f"which a mount point cannot take: give a folder inside it, e.g. --out {point}/out")
        assert list(point.iterdir()) == [] and not list(tmp_path.glob(f".{point.name}*"))
    assert main([*args, "--out", str(point / "out")]) == 0


def test_compare_of_a_damaged_ablation_or_a_summary_of_something_else_is_one_line(strata_evaluated, tmp_path,
                                                                                  capsys):
    import shutil

    a = tmp_path / "A"
    shutil.copytree(strata_evaluated.eval0, a)
    path = a / "context_ablation.parquet"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    line = one_line(capsys, main(["compare", str(a), str(strata_evaluated.eval1), "--out", str(tmp_path / "cmp")]))
    assert f"{path} is damaged" in line and "rebuild it with `genome-lm eval` and --overwrite" in line
    shutil.rmtree(a)
    shutil.copytree(strata_evaluated.eval0, a)
    for text, lacks in (("{}", "overall, buckets, config"), ("[1, 2]", "overall, buckets, config"),
                        ('{"overall": {}, "buckets": [], "config": {"buckets": "log2"}}', "config.seq_len")):
        (a / "summary.json").write_text(text)
        line = one_line(capsys, main(["compare", str(a), str(strata_evaluated.eval1), "--out", str(tmp_path / "cmp")]))
        assert line.endswith(f"{a / 'summary.json'} is not an eval's summary (it has no {lacks}); rebuild it with "
                             "`genome-lm eval` and --overwrite")
    assert not (tmp_path / "cmp").exists()


def test_compare_of_an_eval_with_a_changed_byte_is_one_line(evaluated, tmp_path, capsys):
    """Pages are checksummed: bytes flipped in the middle of tokens.parquet (its size unchanged) are
    found, rather than read as other numbers."""
    import shutil

    a = tmp_path / "A"
    shutil.copytree(evaluated.eval0, a)
    path = a / "tokens.parquet"
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 256] = bytes(b ^ 0x5A for b in data[middle:middle + 256])
    path.write_bytes(bytes(data))
    line = one_line(capsys, main(["compare", str(a), str(evaluated.eval1), "--out", str(tmp_path / "cmp")]))
    assert f"{path} is damaged" in line and "rebuild it with `genome-lm eval` and --overwrite" in line
    assert not (tmp_path / "cmp").exists()
