"""The training loop on glm53-tiny and tiny synthetic shards (CPU)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from genome_lm.cli import main
from genome_lm.config import load_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.train import train
from tests.helpers import assert_grads_close, tiny_model, write_experiment

ROOT = Path(__file__).resolve().parents[2]


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def test_loss_decreases_and_outputs_are_written(tmp_path, tiny_shards):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards,
                           train={"steps": 30, "micro_batch": 4, "lr": 5e-3, "warmup_steps": 3,
                                  "checkpoint_every": 15},
                           data={"seq_len": 128})
    run = tmp_path / "run"
    assert main(["train", exp, "--out", str(run)]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "peak_mem_bytes", "moe_imbalance_max"):
        assert all(isinstance(r[key], float | int) for r in records), key
    first, last = records[0]["loss"], sum(r["loss"] for r in records[-5:]) / 5
    assert last < first - 0.1, (first, last)
    assert (run / "config.yaml").exists()
    last_ckpt = run / "checkpoints" / "last"
    assert last_ckpt.resolve().name == "step_00000030"
    assert (last_ckpt / "model" / "config.json").exists() and (last_ckpt / "train_state" / ".metadata").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last", "step_00000015", "step_00000030"]
    # the saved weights load with upstream transformers
    from transformers.models.glm5_next import Glm5NextTextModel

    Glm5NextTextModel.from_pretrained(str(last_ckpt / "model"))


def _strategy_grads(strategy: dict, seed: int = 0):
    from genome_lm.config import MemoryConfig
    from genome_lm.train.parallelize import parallelize

    model = tiny_model(seed)
    parallelize(model, MemoryConfig(**strategy))
    ids = torch.randint(0, 5, (2, 200), generator=torch.Generator().manual_seed(seed))
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("strategy", [
    dict(recompute="per-layer"),
    dict(recompute="per-layer", offload_layer_inputs=True),
    dict(recompute="selective", recompute_layers=["dsa", "moe"]),
    dict(recompute="selective", recompute_layers=["kda", "dense"], offload_layer_inputs=True),
    dict(moe_block_tokens=37, dsa_block_queries=29, loss_chunk_tokens=50, moe_recompute=True),
])
def test_memory_strategies_give_the_same_loss_and_gradients(strategy):
    ref_loss, ref = _strategy_grads({})
    loss, grads = _strategy_grads(strategy)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_close(str(strategy), grads, ref, 1e-4)


def _train_cmd(exp: str, run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "genome_lm", "train", exp, "--out", str(run), *extra]


def test_killed_run_resumes_with_identical_losses(tmp_path, tiny_shards):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards,
                           train={"steps": 8, "micro_batch": 2, "checkpoint_every": 2, "keep_checkpoints": 3})
    env = dict(os.environ, TQDM_DISABLE="1")
    straight = tmp_path / "straight"
    subprocess.run(_train_cmd(exp, straight), check=True, env=env, capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd(exp, killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:  # wait until step 5 is logged: checkpoint 4 exists, step 6 is not saved
        if (killed / "metrics.jsonl").exists() and max(losses(killed), default=0) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert max(losses(killed)) < 8, "the run finished before it was killed"
    subprocess.run(_train_cmd(exp, killed, "--resume"), check=True, env=env, capture_output=True)
    assert losses(killed) == losses(straight)  # bitwise: same floats after the resume


def test_seq_len_longer_than_the_windows_is_refused_before_anything_is_written(tmp_path, tiny_shards, capsys):
    """4k-token windows cannot give 8k sequences: asking for them is one line, not a short run labelled long."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards)
    run = tmp_path / "run"
    assert main(["train", exp, "--out", str(run), "--set", "data.seq_len=8192"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "data.seq_len=8,192 is longer than the windows" in err and "(4,096 tokens)" in err
    assert "--seq-len 8192" in err
    assert not run.exists()


def test_short_pieces_are_counted_and_the_trained_length_recorded(tmp_path, tiny_shards, caplog):
    """seq_len 3000 on 4k windows: each window's second piece is a 1,096-token tail (a warning, as most
    pieces are short), and metrics.jsonl records the longest sequence each step trained on."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, data={"seq_len": 3000}, train={"steps": 2})
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="genome_lm.train.data"):
        train(load_experiment(exp), out=run)
    warning = [r for r in caplog.records if "shorter than data.seq_len=3000" in r.getMessage()]
    assert warning and warning[0].levelname == "WARNING"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < r["seq_tokens"] <= 3000 for r in records)


def test_rerun_without_resume_is_refused(tmp_path, tiny_shards):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2})
    run = tmp_path / "run"
    train(load_experiment(exp), out=run)
    with pytest.raises(GenomeLMError, match="already has checkpoints.*--resume"):
        train(load_experiment(exp), out=run)


def test_resume_says_what_it_does(tmp_path, tiny_shards, caplog):
    """--resume on a finished run trains nothing and says so; on a run without checkpoints it warns
    that it starts fresh (and trains)."""
    import logging

    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2})
    run = tmp_path / "run"
    train(load_experiment(exp), out=run)
    before = (run / "metrics.jsonl").read_text()
    caplog.set_level(logging.INFO, logger="genome_lm")
    assert train(load_experiment(exp), out=run, resume=True) == {}
    assert "at step 2 and train.steps is 2: nothing to train; raise train.steps" in caplog.text
    assert "loss nan" not in caplog.text and (run / "metrics.jsonl").read_text() == before
    caplog.clear()
    record = train(load_experiment(exp), out=tmp_path / "fresh", resume=True)
    assert "no checkpoint in" in caplog.text and "starting a fresh run from step 0" in caplog.text
    assert "start over" not in caplog.text
    assert record["step"] == 2
    shutil.rmtree(run / "checkpoints")  # removed after the run: its history records the step it saved
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(GenomeLMError, match=r"has no checkpoint, but its metrics.jsonl records step 2, where the run "
                                            r"saved one: its checkpoints were removed"):
        train(load_experiment(exp), out=run, resume=True)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files
    caplog.clear()  # an attempt stopped before its first checkpoint (step 2) left metrics and a config
    (run / "metrics.jsonl").write_text(before.splitlines()[0] + "\n")
    assert train(load_experiment(exp), out=run, resume=True)["step"] == 2
    assert "starting a fresh run from step 0 (metrics.jsonl and config.yaml of the attempt without a checkpoint " \
           "start over)" in caplog.text
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_without_metrics_jsonl_warns_and_starts_it_again(tmp_path, tiny_shards, caplog):
    """--resume of a run whose metrics.jsonl was deleted continues from its checkpoint and says that the
    records before it are lost; metrics.jsonl then holds the steps trained after it."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2})
    run = tmp_path / "run"
    train(load_experiment(exp), out=run)
    (run / "metrics.jsonl").unlink()
    train(load_experiment(exp, ["train.steps=3"]), out=run, resume=True)
    assert "metrics.jsonl is missing: the records of steps 1-2 are lost" in caplog.text
    assert list(losses(run)) == [3]


def test_resume_refuses_changed_math_and_leaves_the_run_as_it_was(tmp_path, tiny_shards, capsys):
    """A new learning rate or model on --resume is one line naming each key, old -> new; config.yaml,
    metrics and checkpoints stay as they were."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2})
    run = tmp_path / "run"
    assert main(["train", exp, "--out", str(run)]) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    for change, named in [(["--set", "train.lr=5e-3", "--set", "train.steps=4"], "train.lr 0.003 -> 0.005"),
                          (["--set", "model.name=glm53-demo"], "model.name 'glm53-tiny' -> 'glm53-demo'")]:
        assert main(["train", exp, "--out", str(run), "--resume", *change]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err and named in err and "train into a new --out" in err
        assert "train.steps" not in err  # steps may change
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_resume_refuses_shards_rebuilt_from_another_fasta(tmp_path, capsys):
    """The run records the sha256 of its shards' manifest.json; --resume on shards rebuilt at the same
    path from another genome is one line naming both checksums, and leaves the run as it was."""
    from genome_lm.outputs import file_digest
    from tests.helpers import make_shards

    shards = make_shards(tmp_path / "a", seed=3)
    exp = write_experiment(tmp_path / "e.yaml", shards, train={"steps": 2})
    run = tmp_path / "run"
    assert main(["train", exp, "--out", str(run)]) == 0
    old = file_digest(shards / "manifest.json")
    shutil.rmtree(shards)
    shutil.move(make_shards(tmp_path / "b", seed=4), shards)
    new = file_digest(shards / "manifest.json")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["train", exp, "--out", str(run), "--resume", "--set", "train.steps=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"manifest.json had sha256 {old}, now {new}" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_resume_without_a_readable_config_yaml_is_refused(tmp_path, tiny_shards, capsys):
    """config.yaml is what --resume compares the new settings with: missing or not YAML, the resume is
    one line naming it, and nothing in the run changes."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2})
    run = tmp_path / "run"
    assert main(["train", exp, "--out", str(run)]) == 0
    capsys.readouterr()
    for damage, named in [(lambda p: p.write_text("data: [\n"), "config.yaml is not valid YAML (line 2, column 1)"),
                          (lambda p: p.unlink(), "config.yaml is missing")]:
        damage(run / "config.yaml")
        before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
        assert main(["train", exp, "--out", str(run), "--resume", "--set", "train.steps=3"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("genome-lm train: error: --resume: ") and named in err, err
        assert "restore it, or train into a new --out" in err
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_resume_takes_a_new_split_of_the_same_batch_and_refuses_another_batch(tmp_path, tiny_shards, capsys):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2})  # micro_batch 2
    run = tmp_path / "run"
    assert main(["train", exp, "--out", str(run)]) == 0
    assert main(["train", exp, "--out", str(run), "--resume", "--set", "train.micro_batch=4"]) == 2
    assert "train.micro_batch 2 -> 4, sequences per step 2 -> 4" in capsys.readouterr().err
    assert main(["train", exp, "--out", str(run), "--resume", "--set", "train.steps=3", "--set", "train.micro_batch=1",
                 "--set", "train.grad_accum=2"]) == 0  # 1 x 2 = 2 sequences per step, as before


def test_resume_takes_steps_and_keeps_the_earlier_config(tmp_path, tiny_shards):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2})
    run = tmp_path / "run"
    train(load_experiment(exp), out=run)
    first = (run / "config.yaml").read_text()
    record = train(load_experiment(exp, ["train.steps=3", "log.every=2"]), out=run, resume=True)
    assert record["step"] == 3
    assert (run / "config.resume-1.yaml").read_text() == first
    assert load_experiment(run / "config.yaml").train.steps == 3


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_non_finite_loss(tmp_path, tiny_shards, monkeypatch, mode):
    import genome_lm.train.trainer as trainer

    real = trainer.parallelize
    calls = {"n": 0}

    def poisoned(model, memory, *parallel):
        real(model, memory, *parallel)

        def hook(module, args, output):
            calls["n"] += 1
            return output * float("nan") if calls["n"] == 3 else output

        model.model.norm.register_forward_hook(hook)
        return model

    monkeypatch.setattr(trainer, "parallelize", poisoned)
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 4, "checkpoint_every": 2,
                                                                    "on_nonfinite": mode})
    run = tmp_path / "run"
    if mode == "stop":
        with pytest.raises(GenomeLMError, match=r"non-finite loss at step 3.*step_00000002"):
            train(load_experiment(exp), out=run)
        assert (run / "checkpoints" / "last").resolve().name == "step_00000002"
    else:
        train(load_experiment(exp), out=run)
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r.get("skipped", False) for r in records] == [False, False, True, False]
        assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records if not r.get("skipped"))


def test_wandb_offline_files(tmp_path, tiny_shards):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2}, log={"wandb": "offline"})
    run = tmp_path / "run"
    train(load_experiment(exp), out=run)
    runs = list((run / "wandb").glob("offline-run-*"))
    assert runs and any(runs[0].rglob("*.wandb"))


@pytest.mark.parametrize("name", ["glm53flash_512k_64xb200", "glm53flash_1m_64xb200"])
def test_dry_run_full_size(full_shards, capsys, name):
    code = main(["train", str(ROOT / "experiments" / f"{name}.yaml"), "--dry-run",
                 "--set", f"data.shards={full_shards}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "313,326,816,766" in out and "dry run OK" in out
    assert "recompute=per-layer, offload_layer_inputs=True (the last 1 kept on the device)" in out
    assert "ep=8" in out and "36 of 288 routed experts per rank" in out and "kda_head_block=32" in out
    assert "bfloat16 AdamW moments" in out and "fits" in out.splitlines()[-1]
    assert "precision: bf16 compute; float32 master weights" in out and "in 200 float32 FSDP2 groups" in out


def test_init_from_checkpoint(tmp_path, tiny_shards):
    base = tmp_path / "base"
    train(load_experiment(write_experiment(tmp_path / "b.yaml", tiny_shards, train={"steps": 2})), out=base)
    exp = write_experiment(tmp_path / "l.yaml", tiny_shards, train={"steps": 1, "lr": 1e-12},
                           model={"init": str(base / "checkpoints" / "last")}, data={"seq_len": 256})
    record = train(load_experiment(exp), out=tmp_path / "long")
    from genome_lm.model import build

    a = build(base / "checkpoints" / "last" / "model").model.state_dict()
    b = build(tmp_path / "long" / "checkpoints" / "last" / "model").model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)  # lr ~ 0: weights came from init
    assert record["step"] == 1


def test_training_on_the_held_out_split_warns(tmp_path, tiny_shards, caplog):
    from genome_lm.train.trainer import check_data

    with caplog.at_level("WARNING", logger="genome_lm.train.trainer"):
        check_data(load_experiment(write_experiment(tmp_path / "e.yaml", tiny_shards, data={"split": "eval"})))
    assert "training on the held-out chromosomes (chr22)" in caplog.text


def test_resume_falls_back_from_a_damaged_checkpoint(tmp_path, tiny_shards, caplog):
    """The newest checkpoint's DCP file is truncated: resume names it in a warning, continues from the
    previous one, and trains steps 3-4 again to the losses they had."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 4, "checkpoint_every": 2})
    intact, damaged = tmp_path / "intact", tmp_path / "damaged"
    for run in (intact, damaged):
        train(load_experiment(exp), out=run)
    distcp = next((damaged / "checkpoints" / "step_00000004" / "train_state").glob("*.distcp"))
    distcp.write_bytes(distcp.read_bytes()[: distcp.stat().st_size // 2])  # DCP itself reads this without an error
    with caplog.at_level("WARNING", logger="genome_lm.train.checkpoint"):
        record = train(load_experiment(exp), out=damaged, resume=True)
    assert "step_00000004 does not load" in caplog.text and "from the previous checkpoint, step_00000002" in caplog.text
    assert record["step"] == 4 and losses(damaged) == losses(intact)  # bitwise: steps 3-4 again from step 2


def test_a_resume_that_loads_no_checkpoint_leaves_the_run_as_it_was(tmp_path, tiny_shards, capsys):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2, "checkpoint_every": 1})
    run = tmp_path / "run"
    train(load_experiment(exp), out=run)
    for distcp in (run / "checkpoints").glob("step_*/train_state/*.distcp"):
        distcp.write_bytes(distcp.read_bytes()[:100])
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main(["train", exp, "--out", str(run), "--resume", "--set", "train.steps=3"]) == 2
    assert "no checkpoint in" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # config.yaml as it was


@pytest.mark.parametrize("case", ["model.name", "model.init missing", "model.init is shards", "truncated shard"])
def test_a_run_that_cannot_start_leaves_no_run_directory(tmp_path, tiny_shards, capsys, case):
    import shutil

    shards = tmp_path / "shards"
    shutil.copytree(tiny_shards, shards)
    exp = write_experiment(tmp_path / "e.yaml", shards, train={"steps": 2})
    sets = {"model.name": ["model.name=glm99"], "model.init missing": [f"model.init={tmp_path / 'nowhere'}"],
            "model.init is shards": [f"model.init={shards}"], "truncated shard": []}[case]
    if case == "truncated shard":
        arrow = next((shards / "train").glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:-100])
    argv = ["train", exp, "--out", str(tmp_path / "r")] + [x for s in sets for x in ("--set", s)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("genome-lm train: error: ") and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "r").exists()


def test_resume_after_a_metrics_line_cut_short(tmp_path, tiny_shards, caplog):
    """A kill during the append leaves half a JSON line: resume drops it with a warning and goes on."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 4, "checkpoint_every": 2})
    intact, cut = tmp_path / "intact", tmp_path / "cut"
    import shutil

    for run in (intact, cut):
        train(load_experiment(exp), out=run)
    shutil.rmtree(cut / "checkpoints" / "step_00000004")  # killed after step 3 began its metrics line
    metrics = cut / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]) + '{"step": 3, "loss": 2.7')
    with caplog.at_level("WARNING", logger="genome_lm.train.metrics"):
        train(load_experiment(exp), out=cut, resume=True)
    assert "line(s) 3, which are not whole JSON records" in caplog.text
    assert losses(cut) == losses(intact)


def test_warmup_longer_than_the_run_warns(tmp_path, tiny_shards, caplog):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, train={"steps": 2, "warmup_steps": 100})
    with caplog.at_level("WARNING", logger="genome_lm.train.trainer"):
        train(load_experiment(exp), out=tmp_path / "r")
    assert "train.warmup_steps=100 is more than train.steps=2: the learning rate stops at 2/100" in caplog.text
