"""`evaluate` on a tiny checkpoint: outputs, agreement with the model/trainer loss, pieces, resume."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.eval import EvalConfig, evaluate, iter_windows, load_summary
from genome_lm.eval.outputs import cache_dir_for
from genome_lm.genome import load_shards
from genome_lm.genome.tokenizer import N_ID
from tests.eval.data import N_WINDOWS


def _model(ckpt):
    from genome_lm.model import apply_long_context, build

    model = build(ckpt).model
    apply_long_context(model)
    return model.eval()


def test_outputs_and_summary_shape(evaluated):
    s = load_summary(evaluated.eval0)
    assert set(s["overall"]) >= {"mean_nll", "n_tokens", "bits_per_base", "ci_low", "ci_high"}
    assert s["buckets"][0]["lo"] == 0 and s["buckets"][0]["n_tokens"] == 0  # token 0 has no prediction
    for b in s["buckets"]:
        assert set(b) >= {"lo", "hi", "n_tokens", "mean_nll", "ci_low", "ci_high", "bits_per_base"}
    assert s["buckets"][-1]["hi"] == 1024  # 1k windows: contexts 0..1023
    assert sum(b["n_tokens"] for b in s["buckets"]) == s["overall"]["n_tokens"]
    r = s["repeat"]
    assert r["masked"]["overall"]["n_tokens"] + r["unmasked"]["overall"]["n_tokens"] == s["overall"]["n_tokens"]
    assert s["shards"]["manifest_sha256"] and s["checkpoint"]["weights_sha256"]
    assert s["config"]["seq_len"] == 1024 and s["config"]["engine"] == "parallel"
    # per-token NLL maps back to the shard windows: same coordinates, NaN exactly at N and at token 0
    ds = load_shards(evaluated.shards, "eval")
    table = pq.read_table(evaluated.eval0 / "tokens.parquet")
    assert table.schema.field("nll").type.value_type == "float" and table.num_rows == N_WINDOWS
    for w in iter_windows(evaluated.eval0):
        row = ds[w["window"]]
        assert ((w["chrom"], w["start"], w["end"], w["strand"])
                == (row["chrom"], row["start"], row["end"], row["strand"]))
        unscored = row["tokens"] == N_ID
        unscored[0] = True
        assert np.array_equal(np.isnan(w["nll"]), unscored)
    assert not cache_dir_for(evaluated.eval0).exists()


def test_eval_reproduces_trainer_loss(evaluated):
    """Each window's mean NLL equals the model's loss on the trainer's batch for that window."""
    from genome_lm.train.data import SequenceStream

    model = _model(evaluated.ckpt0)
    stream = SequenceStream(str(evaluated.shards), "eval", seq_len=1024, reverse_complement=False, min_piece=1)
    per_window = {w["window"]: w["nll"] for w in iter_windows(evaluated.eval0)}
    checked = 0
    for _ in range(len(stream.pieces)):
        row, offset, _length = stream.pieces[stream._order[stream.index]].tolist()
        batch = stream.next_batch(1)
        if row not in per_window:
            continue
        assert offset == 0
        with torch.no_grad():
            loss = float(model(**batch).loss)
        assert np.nanmean(per_window[row].astype(np.float64)) == pytest.approx(loss, rel=1e-5)
        checked += 1
    assert checked == N_WINDOWS
    s = load_summary(evaluated.eval0)
    all_nll = np.concatenate([v for v in per_window.values()])
    assert s["overall"]["mean_nll"] == pytest.approx(np.nanmean(all_nll.astype(np.float64)), rel=1e-9)


def test_seq_len_scores_pieces_with_fresh_context(eval_inputs, evaluated, tmp_path):
    s = evaluate(EvalConfig(checkpoint=str(eval_inputs.ckpt0), shards=str(eval_inputs.shards), out=str(tmp_path / "e"),
                            max_windows=1, seq_len=256, buckets="0,16,128,256", resamples=100), show_progress=False)
    assert [(b["lo"], b["hi"]) for b in s["buckets"]] == [(0, 16), (16, 128), (128, 256)]
    assert s["overall"]["n_tokens"] == sum(b["n_tokens"] for b in s["buckets"])
    nll = next(iter_windows(tmp_path / "e"))["nll"]
    full = next(iter_windows(evaluated.eval0))["nll"]
    assert np.isnan(nll[[0, 256, 512, 768]]).all()
    # each piece is its own forward pass: context restarts at 256, 512, 768
    model = _model(eval_inputs.ckpt0)
    tokens = torch.from_numpy(load_shards(eval_inputs.shards, "eval")[0]["tokens"].astype(np.int64))
    for start in (0, 256):
        piece = tokens[start : start + 256][None]
        with torch.no_grad():
            ref = model(piece, labels=torch.where(piece == N_ID, -100, piece), return_per_token_nll=True)
        ref_nll = np.where(ref.nll_mask[0].numpy(), ref.per_token_nll[0].numpy(), np.nan)
        np.testing.assert_allclose(nll[start : start + 256], ref_nll, rtol=1e-5, atol=1e-6)
    assert not np.allclose(nll[257:512], full[257:512], rtol=1e-3)  # less context than the whole window


def test_interrupted_eval_resumes(eval_inputs, evaluated, tmp_path, monkeypatch, capsys):
    import genome_lm.eval.run as run

    real, calls, interrupt = run.score_window, [], [True]

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 and interrupt[0]:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C in the second window
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "score_window", flaky)
    cfg = EvalConfig(checkpoint=str(eval_inputs.ckpt0), shards=str(eval_inputs.shards), out=str(tmp_path / "e"),
                     max_windows=N_WINDOWS, resamples=500)
    argv = ["eval", "--checkpoint", cfg.checkpoint, "--shards", cfg.shards, "--out", cfg.out,
            "--max-windows", str(N_WINDOWS), "--resamples", "500"]
    assert main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"genome-lm eval: interrupted; the 1 window(s) scored so far are kept in {cache_dir_for(tmp_path / 'e')}, "
        "and the same eval command resumes from them (delete it to start over)")
    assert not (tmp_path / "e").exists()  # nothing half-written at --out
    assert len(list(cache_dir_for(tmp_path / "e").glob("w*.npz"))) == 1
    calls.clear()
    interrupt[0] = False
    s = evaluate(cfg, show_progress=False)
    assert len(calls) == N_WINDOWS - 1  # only the windows not cached
    ref = load_summary(evaluated.eval0)
    assert s["overall"] == ref["overall"] and s["buckets"] == ref["buckets"]
    for a, b in zip(iter_windows(tmp_path / "e"), iter_windows(evaluated.eval0)):
        np.testing.assert_array_equal(a["nll"], b["nll"])
    assert not cache_dir_for(tmp_path / "e").exists()


def test_an_eval_stopped_before_its_first_window_leaves_no_cache(eval_inputs, tmp_path, monkeypatch, capsys):
    import genome_lm.eval.run as run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "score_window", interrupted)
    out = tmp_path / "e"
    assert main(["eval", "--checkpoint", str(eval_inputs.ckpt0), "--shards", str(eval_inputs.shards), "--out",
                 str(out), "--max-windows", "2"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "genome-lm eval: interrupted"
    assert list(tmp_path.iterdir()) == []  # no output, no cache


@pytest.mark.parametrize("flags,expected", [
    (["--device", "tpu"], "device: unknown device 'tpu'; use cpu, cuda or cuda:N"),
    (["--device", "cuda"], "--device cuda: this machine has no CUDA GPU that torch can use"),
    (["--buckets", ""], "buckets: is empty; use 'log2' or bucket edges such as 0,16,256,4k"),
])
def test_a_device_or_buckets_that_cannot_be_used_are_one_line(eval_inputs, tmp_path, capsys, flags, expected):
    if flags[1] == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["eval", "--checkpoint", str(eval_inputs.ckpt0), "--shards", str(eval_inputs.shards), "--out",
                 str(tmp_path / "e"), "--max-windows", "1", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("genome-lm eval: error: ") and expected in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_flags_without_the_flag_they_qualify_warn(eval_inputs, tmp_path, caplog):
    args = ["eval", "--checkpoint", str(eval_inputs.ckpt0), "--shards", str(eval_inputs.shards), "--resamples", "20"]
    assert main([*args, "--out", str(tmp_path / "a"), "--window-pick", "spread", "--ablation-targets", "64"]) == 0
    assert "--window-pick spread without --max-windows: every window of the split is scored" in caplog.text
    assert "--ablation-targets 64 without --context: no context ablation is run" in caplog.text
    caplog.clear()
    assert main([*args, "--out", str(tmp_path / "b"), "--window-pick", "spread", "--max-windows", "2"]) == 0
    assert "without --max-windows" not in caplog.text and "without --context" not in caplog.text
    assert "is longer than every window" not in caplog.text
    assert main([*args, "--out", str(tmp_path / "c"), "--max-windows", "1", "--seq-len", "64k"]) == 0
    assert "--seq-len 65536 is longer than every window scored (at most 1024 tokens): each is scored whole" \
        in caplog.text


def test_existing_out_is_refused(evaluated):
    cfg = EvalConfig(checkpoint=str(evaluated.ckpt0), shards=str(evaluated.shards), out=str(evaluated.eval0))
    with pytest.raises(GenomeLMError, match="already exists"):
        evaluate(cfg)


def test_scoring_the_train_split_warns(evaluated, tmp_path, caplog):
    from genome_lm.eval.run import check_inputs

    cfg = EvalConfig(checkpoint=str(evaluated.ckpt0), shards=str(evaluated.shards), out=str(tmp_path / "e"),
                     split="train", max_windows=1)
    with caplog.at_level("WARNING", logger="genome_lm.eval.run"):
        check_inputs(cfg)
    assert "--split train: scoring the chromosomes the model trained on" in caplog.text


def test_parity_report_with_a_stand_in_engine(eval_inputs, tmp_path, monkeypatch):
    """The --parity plumbing, with a stand-in streaming engine (the parallel forward + a known offset)."""
    def score_streaming(model, input_ids, chunk_tokens):
        out = model(input_ids, return_per_token_nll=True)
        return out.per_token_nll[0] + 1e-3

    fake = types.ModuleType("genome_lm.model.streaming")
    fake.score_streaming = score_streaming
    monkeypatch.setitem(sys.modules, "genome_lm.model.streaming", fake)
    s = evaluate(EvalConfig(checkpoint=str(eval_inputs.ckpt0), shards=str(eval_inputs.shards), out=str(tmp_path / "e"),
                            max_windows=1, parity=True, resamples=100), show_progress=False)
    p = json.loads((tmp_path / "e" / "parity.json").read_text())
    assert p == s["parity"] and p["engines"] == ["parallel", "streaming"]
    assert p["overall"]["n_tokens"] == s["overall"]["n_tokens"]
    assert p["overall"]["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    assert p["overall"]["mean_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    assert sum(b["n_tokens"] for b in p["buckets"]) == p["overall"]["n_tokens"]


def test_parity_streaming_engine_fp32(eval_inputs, tmp_path):
    """The real streaming engine agrees with the training forward within 1e-4 (fp32)."""
    s = evaluate(EvalConfig(checkpoint=str(eval_inputs.ckpt0), shards=str(eval_inputs.shards), out=str(tmp_path / "e"),
                            max_windows=1, parity=True, chunk_tokens=128, resamples=100), show_progress=False)
    assert s["parity"]["overall"]["n_tokens"] > 0
    assert s["parity"]["overall"]["max_abs_diff"] <= 1e-4


def test_window_indices_first_and_spread():
    from genome_lm.eval.run import window_indices

    assert window_indices(10, None, "spread").tolist() == list(range(10))  # no --max-windows: all
    assert window_indices(10, 3, "first").tolist() == [0, 1, 2]
    assert window_indices(10, 3, "spread").tolist() == [1, 5, 8]  # the middle of each third
    assert window_indices(10, 1, "spread").tolist() == [5]
    assert window_indices(4, 9, "spread").tolist() == [0, 1, 2, 3]  # more asked than there are
    for n_split in range(1, 40):
        for w in range(1, n_split + 1):
            rows = window_indices(n_split, w, "spread")
            assert len(rows) == w and rows[0] >= 0 and rows[-1] < n_split and (np.diff(rows) > 0).all()
            gaps = np.diff(rows)  # evenly spaced: n_split / w rows apart, rounded either way
            assert (gaps.size == 0 or gaps.max() - gaps.min() <= 1) and rows[0] == int(n_split / w / 2)


def test_spread_windows_are_the_splits_rows(eval_inputs, evaluated, tmp_path):
    """--window-pick spread scores the split's rows `window_indices` names, records their row ids, and
    scores each as an eval of the first windows does; compare refuses to pair it with a first-N eval."""
    from genome_lm.eval import write_compare
    from genome_lm.eval.run import window_indices

    ds = load_shards(eval_inputs.shards, "eval")
    rows = window_indices(len(ds), 2, "spread")
    assert rows[-1] >= N_WINDOWS  # the sample reaches past the first windows
    common = dict(checkpoint=str(eval_inputs.ckpt0), shards=str(eval_inputs.shards), resamples=100)
    s = evaluate(EvalConfig(**common, out=str(tmp_path / "spread"), max_windows=2, window_pick="spread"),
                 show_progress=False)
    assert s["shards"]["n_windows"] == 2 and s["shards"]["window_pick"] == "spread"
    ref = evaluate(EvalConfig(**common, out=str(tmp_path / "first"), max_windows=int(rows[-1]) + 1),
                   show_progress=False)
    assert ref["shards"]["window_pick"] == "first"
    full = {w["window"]: w for w in iter_windows(tmp_path / "first")}
    got = list(iter_windows(tmp_path / "spread"))
    assert [w["window"] for w in got] == rows.tolist()
    for w in got:
        row = ds[w["window"]]
        assert (w["chrom"], w["start"], w["end"]) == (row["chrom"], row["start"], row["end"])
        np.testing.assert_array_equal(w["nll"], full[w["window"]]["nll"])
    with pytest.raises(GenomeLMError, match="--window-pick"):
        write_compare(evaluated.eval0, tmp_path / "spread", tmp_path / "cmp", resamples=10)
