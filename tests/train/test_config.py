"""Experiment configs: validation names the key, overrides apply, every shipped experiment loads."""

from pathlib import Path

import pytest

from genome_lm.cli import main
from genome_lm.config import load_experiment
from genome_lm.errors import GenomeLMError

EXPERIMENTS = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.yaml"))
GOOD = "data: {shards: s, seq_len: 64k}\nmodel: {name: glm53-tiny}\ntrain:\n  steps: 10\n"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_shipped_experiments_validate(path):
    cfg = load_experiment(path)
    assert cfg.name == path.stem and cfg.train.steps > 0


def test_sizes_and_overrides(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text(GOOD)
    cfg = load_experiment(p, ["train.lr=1e-5", "data.seq_len=1M", "memory.recompute=per-layer",
                              "memory.offload_layer_inputs=true", "model.overrides.vocab_size=8"])
    assert cfg.data.seq_len == 2**20 and cfg.train.lr == 1e-5 and cfg.memory.offload_layer_inputs
    assert cfg.model.overrides == {"vocab_size": 8}
    assert load_experiment(p).data.seq_len == 64 * 1024


@pytest.mark.parametrize("text,overrides,match", [
    (GOOD + "  lrr: 1\n", [], r"unknown key train.lrr; did you mean train.lr\?"),
    (GOOD, ["train.lr=fast"], r"^--set train.lr: .*number.*'fast'"),  # blamed on the --set, not the file
    (GOOD, ["train.lr=-1"], r"^--set train.lr: must be > 0.0 \(got -1\)"),
    (GOOD, ["data.seq_len=64q"], r"data.seq_len: cannot read '64q'"),
    ("model: {name: glm53-tiny}\ntrain: {steps: 10}\n", [], r"missing required key data"),
    (GOOD, ["memory.recompute=selective"], r"recompute_layers"),
    (GOOD, ["memory.offload_layer_inputs=true"], r"offload_layer_inputs needs recompute"),
    (GOOD, ["train.steps=0"], r"^--set train.steps: must be > 0 \(got 0\)"),
    (GOOD, ["train.moe_bias_update_rate=-1"], r"^--set train.moe_bias_update_rate: must be >= 0.0 \(got -1\)"),
    (GOOD.replace("steps: 10", "steps: 0"), [], r"e.yaml: train.steps: must be > 0 \(got 0\)"),
    (GOOD, ["memory.recompute=sometimes"], r"memory.recompute: .*'none', 'per-layer' or 'selective'"),
    (GOOD, ["trainsteps"], r"expected KEY=VALUE"),
    ("data: [1, 2\n", [], r"not valid YAML \(line 2, column 1\): expected ',' or ']'"),
    (GOOD.replace("train:", "trian:"), [], r"unknown key trian; did you mean train\?"),  # not "missing train"
    (GOOD, ["trian.steps=3"], r"^--set: unknown key trian; did you mean train\?"),  # the --set's typo, not the file's
    (GOOD, ["train.steps="], r"^--set train.steps: expected an integer \(the value is empty\)$"),
    (GOOD, ["train.learning_rate=1e-4"], r"^--set: unknown key train.learning_rate; did you mean train.lr\?$"),
    (GOOD, ["train.wd=0"], r"did you mean train.weight_decay\?$"),
    (GOOD, ["memory.foo=1"], r"^--set: unknown key memory.foo; remove it$"),  # not "did you mean memory?"
    (GOOD, ["train.betas=[0.9"], r"^--set 'train.betas=\[0.9': the value is not valid YAML: expected ',' or ']'"),
    (GOOD + "train:\n  steps: 3\n", [], r"e.yaml is not valid YAML \(line 5, column 1\): train is given twice in one "
     r"mapping, on lines 3 and 5; keep one$"),
    (GOOD.replace("seq_len: 64k}", "seq_len: 64k, seq_len: 1M}"), [], r"seq_len is given twice in one mapping, on "
     r"lines 1 and 1"),
    ("data:\n  shards: s\n  seq_len: 64k\n  seq_len: 1M\n" + GOOD[GOOD.index("model"):], [],
     r"\(line 4, column 3\): seq_len is given twice in one mapping, on lines 3 and 4; keep one$"),
])
def test_errors_name_the_key(tmp_path, text, overrides, match):
    p = tmp_path / "e.yaml"
    p.write_text(text)
    with pytest.raises(GenomeLMError, match=match):
        load_experiment(p, overrides)


def test_cli_reports_config_errors_in_one_line(tmp_path, capsys):
    p = tmp_path / "e.yaml"
    p.write_text(GOOD + "  lrr: 1\n")
    assert main(["train", str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key train.lrr" in err[0]
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["train", str(tmp_path)]) == 2  # a folder given as the experiment
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"genome-lm train: error: {tmp_path} is a folder, not a YAML file; give the file itself (keys data, "
                   "model, train, ... (the sections))"]


@pytest.mark.parametrize("command", ["train", "plan", "prepare", "eval", "synth"])
def test_a_file_that_is_not_utf8_is_one_line(tmp_path, capsys, command):
    """A PNG given as the experiment (train, plan), a Latin-1 byte in a comment of a --config file
    (prepare, eval, synth): one line naming the file and the first byte that is not UTF-8."""
    if command in ("train", "plan"):
        path, offset, byte = tmp_path / "e.yaml", 0, "0x89"
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
        argv = [command, str(path)]
    else:
        path, offset, byte = tmp_path / "c.yaml", 20, "0xe9"
        path.write_bytes(b"# caf\xc3\xa9 au lait, caf\xe9 noir\nseed: 1\n")  # UTF-8's e-acute, then Latin-1's
        argv = [command, "--config", str(path), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"genome-lm {command}: error: {path} is not UTF-8 text (byte {byte} at offset {offset}); save it as UTF-8, "
        "or give the YAML file you meant"]
    assert not (tmp_path / "out").exists()


def test_relative_shards_are_read_from_the_working_directory(tmp_path, capsys, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "e.yaml").write_text(GOOD.replace("shards: s", "shards: shards"))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "sub/e.yaml", "--out", "r"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"genome-lm train: error: shards has no manifest.json (a relative path: read from the working directory "
        f"{tmp_path}); is it the --out of `genome-lm prepare`?")
    assert not (tmp_path / "r").exists()


def test_an_unknown_model_override_is_one_line(tmp_path, tiny_shards, capsys):
    """A `model.overrides` key that is no config field would sit on the config unread: refused before
    anything is written, with the nearest field."""
    from tests.helpers import write_experiment

    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 1})
    for key, hint in (("index_top_k", "did you mean index_topk?"),
                      ("bogus", "give one, e.g. model.overrides.index_topk")):
        assert main(["train", exp, "--out", str(tmp_path / "run"), "--set", f"model.overrides.{key}=3"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"genome-lm train: error: model.overrides.{key}: not a field of Glm5NextTextConfig; {hint}"]
        assert not (tmp_path / "run").exists()
