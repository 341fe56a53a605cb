"""`train.export_model` (true / last / false) and `genome-lm export CHECKPOINT --out DIR`: the model
directory written later from `train_state/` is the one the trainer would have written."""

from __future__ import annotations

import json

import pytest
import torch

from genome_lm.cli import main
from genome_lm.config import load_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.model import build
from genome_lm.outputs import MARKER, read_marker
from genome_lm.train import train
from genome_lm.train.checkpoint import resolve_model_dir
from tests.helpers import write_experiment


def same_files(a, b) -> None:
    """The same files with the same bytes; the ownership markers agree on the kind and the files
    (their `inputs` say what each was made from, which differs)."""
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for f in a.iterdir():
        if f.name != MARKER:
            assert f.read_bytes() == (b / f.name).read_bytes(), f.name
    marker_a, marker_b = read_marker(a), read_marker(b)
    assert marker_a["kind"] == marker_b["kind"] == "model" and marker_a["entries"] == marker_b["entries"]


@pytest.fixture(scope="module")
def last_only(tmp_path_factory, tiny_shards):
    root = tmp_path_factory.mktemp("export_last")
    exp = write_experiment(root / "e.yaml", tiny_shards, train={"steps": 4, "export_model": "last"})
    train(load_experiment(exp), out=root / "run")
    return root / "run" / "checkpoints"


def test_export_model_last_writes_model_only_at_the_end(last_only):
    assert not (last_only / "step_00000002" / "model").exists()
    assert (last_only / "step_00000004" / "model" / "model.safetensors").is_file()
    meta = json.loads((last_only / "step_00000002" / "genome_lm.json").read_text())
    assert meta["model_exported"] is False
    with pytest.raises(GenomeLMError, match=r"has no model/.*genome-lm export .*step_00000002 --out DIR"):
        resolve_model_dir(last_only / "step_00000002")


def test_export_command_equals_the_trainers_model_dir(last_only, tmp_path):
    assert main(["export", str(last_only / "last"), "--out", str(tmp_path / "m")]) == 0
    same_files(tmp_path / "m", last_only / "step_00000004" / "model")
    # a small file limit: several files, read from DCP a few tensors at a time; loads back the same
    assert main(["export", str(last_only / "step_00000004"), "--out", str(tmp_path / "s"), "--max-shard-size",
                 "100k"]) == 0
    assert len(list((tmp_path / "s").glob("model-*-of-*.safetensors"))) > 10
    want = build(last_only / "step_00000004" / "model").model.state_dict()
    got = build(tmp_path / "s").model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())
    # the checkpoint without model/ exports too (its weights differ from step 4's)
    assert main(["export", str(last_only / "step_00000002"), "--out", str(tmp_path / "two")]) == 0
    assert not torch.equal(build(tmp_path / "two").model.lm_head.weight, want["lm_head.weight"])


def test_export_user_errors(last_only, tmp_path, capsys):
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "not a training checkpoint" in capsys.readouterr().err
    assert main(["export", str(last_only / "last"), "--out", str(last_only / "step_00000004" / "model")]) == 2
    assert "lies inside this command's input" in capsys.readouterr().err  # the checkpoint's own model/
    assert main(["export", str(last_only / "last"), "--out", str(tmp_path / "y"), "--max-shard-size", "big"]) == 2
    assert "--max-shard-size" in capsys.readouterr().err


def test_export_model_false(tmp_path, tiny_shards):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2, "export_model": False})
    train(load_experiment(exp), out=tmp_path / "run")
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*/model"))
    with pytest.raises(GenomeLMError, match="export_model"):
        load_experiment(exp, ["train.export_model=sometimes"])


@pytest.mark.parametrize("keep", ["100 bytes", "half"])
def test_export_of_a_damaged_checkpoint_is_one_line(last_only, tmp_path, capsys, keep):
    """A .distcp cut to its first half reads without an error from DCP (short tensors): the sizes the
    metadata records are checked first."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(last_only.parent, run, symlinks=True)
    distcp = next((run / "checkpoints" / "step_00000004" / "train_state").glob("*.distcp"))
    data = distcp.read_bytes()
    distcp.write_bytes(data[:100] if keep == "100 bytes" else data[:len(data) // 2])
    assert main(["export", str(run / "checkpoints" / "step_00000004"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "train_state is damaged" in err and "export an earlier checkpoint" in err
    assert not (tmp_path / "m").exists()
