"""Distributed eval (`genome-lm eval --nproc N`, FSDP2 + context parallelism) equals one process.

One launch of 2 gloo processes scores twice: dp 2 (FSDP2 over both ranks, each replica its own
windows; 3 windows, so the last round has one and the other replica runs idle forwards) and
cp 2 (each piece split into two slabs; --seq-len 300 gives pieces of 300 and 124 tokens, slabs
128/172 and 62/62). Per-token NLL must match one process within 1e-5 nats (glm53-tiny, float32),
with the same rows, order and layout of tokens.parquet.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.eval import EvalConfig, evaluate, iter_windows, load_summary
from genome_lm.eval.config import resolve_dtype
from genome_lm.eval.outputs import cache_dir_for
from genome_lm.parallel import callbacks
from tests.eval.data import N_WINDOWS
from tests.faults import KillAt
from tests.helpers import spawn

ATOL = 1e-5  # nats


def _configs(d, root) -> dict[str, dict]:
    base = dict(checkpoint=str(d.ckpt0), shards=str(d.shards), resamples=500)
    return {"dp2": dict(base, out=str(root / "dp2"), max_windows=N_WINDOWS),
            "cp2": dict(base, out=str(root / "cp2"), max_windows=2, seq_len=300, cp=2),
            # bf16 from a float32 checkpoint: each rank's shards are rounded as one process's bf16 model
            "bf16": dict(base, out=str(root / "bf16"), max_windows=2, dtype="bfloat16"),
            # the extra forwards of --strands both and --context (reverse complements, ablation lengths;
            # 896 = t0 of the 1024-token windows reuses the main pass; the 927-token window takes no
            # part) in rounds whose replicas must make as many forwards
            "dp2_extra": dict(base, out=str(root / "dp2_extra"), max_windows=N_WINDOWS, strands="both",
                              context=[100, 896])}


def _worker(rank: int, world: int, configs: dict) -> None:
    for cfg in configs.values():
        evaluate(EvalConfig(**cfg), show_progress=False)


@pytest.fixture(scope="module")
def launched(evaluated, tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_parallel")
    configs = _configs(evaluated, root)
    spawn(_worker, 2, configs, timeout=240)
    one = EvalConfig(**dict(configs["cp2"], out=str(root / "cp2_one"), cp=1))
    evaluate(one, show_progress=False)
    evaluate(EvalConfig(**dict(configs["bf16"], out=str(root / "bf16_one"))), show_progress=False)
    evaluate(EvalConfig(**dict(configs["dp2_extra"], out=str(root / "dp2_extra_one"))), show_progress=False)
    return {"dp2": (root / "dp2", evaluated.eval0), "cp2": (root / "cp2", root / "cp2_one"),
            "bf16": (root / "bf16", root / "bf16_one"), "dp2_extra": (root / "dp2_extra", root / "dp2_extra_one")}


def max_nll_diff(got, want) -> float:
    """Max |NLL difference| over all tokens; asserts identical rows, order, NaN positions and masks."""
    a, b = pq.read_table(got / "tokens.parquet"), pq.read_table(want / "tokens.parquet")
    assert a.schema == b.schema and a.num_rows == b.num_rows
    pa_got, pa_want = pq.ParquetFile(got / "tokens.parquet"), pq.ParquetFile(want / "tokens.parquet")
    assert pa_got.num_row_groups == pa_want.num_row_groups  # one row group per window, as one process writes
    worst = 0.0
    for x, y in zip(iter_windows(got), iter_windows(want), strict=True):
        assert {k: x[k] for k in ("window", "chrom", "start", "end", "strand")} == \
               {k: y[k] for k in ("window", "chrom", "start", "end", "strand")}
        np.testing.assert_array_equal(x["repeat"], y["repeat"])
        np.testing.assert_array_equal(np.isnan(x["nll"]), np.isnan(y["nll"]))
        scored = ~np.isnan(y["nll"])
        worst = max(worst, float(np.abs(x["nll"][scored].astype(np.float64) - y["nll"][scored]).max()))
    return worst


def test_bf16_two_ranks_equal_one_process(launched):
    got, want = launched["bf16"]
    assert max_nll_diff(got, want) <= ATOL
    assert load_summary(got)["config"]["dtype"] == "bfloat16"


@pytest.mark.parametrize("case", ["dp2", "cp2"])
def test_two_ranks_equal_one_process(launched, case):
    got, want = launched[case]
    worst = max_nll_diff(got, want)
    print(f"{case}: max |NLL - one process| = {worst:.2e} nats")
    assert worst <= ATOL
    s, ref = load_summary(got), load_summary(want)
    assert s["overall"]["n_tokens"] == ref["overall"]["n_tokens"]
    assert s["overall"]["mean_nll"] == pytest.approx(ref["overall"]["mean_nll"], abs=ATOL)
    assert [b["n_tokens"] for b in s["buckets"]] == [b["n_tokens"] for b in ref["buckets"]]
    dp, cp = (2, 1) if case == "dp2" else (1, 2)
    assert s["config"]["parallel"] == {"world": 2, "dp": dp, "cp": cp} and s["config"]["dtype"] == "float32"
    assert ref["config"]["parallel"] == {"world": 1, "dp": 1, "cp": 1}
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in want.iterdir())
    assert not cache_dir_for(got).exists()


def test_strands_and_ablation_two_ranks_equal_one_process(launched):
    from genome_lm.eval.ablation import iter_ablation

    got, want = launched["dp2_extra"]
    assert max_nll_diff(got, want) <= ATOL  # forward and reverse-complement rows
    rows = list(zip(iter_ablation(got), iter_ablation(want), strict=True))
    assert len(rows) == N_WINDOWS - 1  # window 2 (927 tokens, targets from 812) is too short for L = 896
    for x, y in rows:
        assert x["window"] == y["window"] and x["target_start"] == y["target_start"]
        np.testing.assert_allclose(x["nll"], y["nll"], rtol=0, atol=ATOL)
    s, ref = load_summary(got), load_summary(want)
    assert s["strands"]["agreement"]["overall"]["n_tokens"] == ref["strands"]["agreement"]["overall"]["n_tokens"]
    assert s["context_ablation"]["target_tokens"] == ref["context_ablation"]["target_tokens"]
    assert s["context_ablation"]["windows_left_out"] == 1


def test_cli_nproc_2_end_to_end(evaluated, tmp_path, monkeypatch, capsys):
    """`genome-lm eval --nproc 2` through torch elastic: the first 2 windows, as one process scored them."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    out = tmp_path / "e"
    argv = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards), "--out", str(out),
            "--max-windows", "2", "--nproc", "2"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"{out}: ")
    ref = tmp_path / "ref"
    evaluate(EvalConfig(checkpoint=str(evaluated.ckpt0), shards=str(evaluated.shards), out=str(ref), max_windows=2,
                        resamples=500), show_progress=False)
    assert max_nll_diff(out, ref) <= ATOL
    assert load_summary(out)["config"]["parallel"] == {"world": 2, "dp": 2, "cp": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "ref"]  # no cache or launch files left


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "3", "--cp", "2"], "--cp 2 does not divide the 3 processes of this launch (dp = processes / cp); "
                                    "use --nproc 2 or 4, or a --cp that divides 3"),
    (["--cp", "2"], "--cp 2 splits each window (region) over 2 processes, this launch has 1; add --nproc 2"),
    (["--nproc", "2", "--cp", "4"], "--cp 4 splits each window (region) over 4 processes, this launch has 2; "
                                    "launch with --nproc 4"),
    (["--dtype", "float16"], "--dtype: unknown dtype 'float16'; use float32 or bfloat16"),
    (["--nproc", "2", "--engine", "streaming"], "--engine streaming and --parity run on one process"),
    (["--nproc", "2", "--parity"], "--engine streaming and --parity run on one process"),
    (["--nproc", "two"], "--nproc: expected an integer (got 'two')"),
    (["--nproc", "2", "--seq-len", "1023", "--cp", "2"], "--cp 2: window 0 ends in a piece of 1 token(s)"),
    (["--ray", "127.0.0.1:1", "--nproc", "2"], "--ray 127.0.0.1:1: cannot reach a Ray cluster there"),
])
def test_user_errors_are_one_line_exit_2(evaluated, tmp_path, capsys, argv, message):
    base = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards),
            "--out", str(tmp_path / "e")]
    assert main([*base, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "e").exists() and not cache_dir_for(tmp_path / "e").exists()


def test_missing_inputs_and_existing_out_are_refused_before_launching(evaluated, capsys):
    assert main(["eval", "--checkpoint", str(evaluated.ckpt0), "--out", "x", "--nproc", "2"]) == 2
    assert "--shards: give the directory written by `genome-lm prepare`" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards), "--nproc", "2"]) == 2
    assert "--out: give the output directory" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards), "--out",
                 str(evaluated.eval0), "--nproc", "2"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_dtype_defaults():
    import torch

    assert resolve_dtype(None, torch.device("cpu")) == "float32"
    assert resolve_dtype(None, torch.device("cuda", 3)) == "bfloat16"
    assert resolve_dtype("float32", torch.device("cuda")) == "float32"
    with pytest.raises(ValueError, match="unknown dtype"):
        EvalConfig(checkpoint="c", dtype="fp8")


def test_dry_run_glm53_flash_on_64_gpus(capsys):
    """Memory per rank of GLM-5.3-Flash (meta device) on 64 GPUs, 1M-token windows in cp 8 slabs."""
    from genome_lm.plan.shapes import model_shape

    assert main(["eval", "--checkpoint", "glm53-flash", "--seq-len", "1M", "--nproc", "64", "--cp", "8",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    shard = model_shape("glm53-flash", "bfloat16").param_bytes / 64 / 2**30
    assert "eval dry run: glm53-flash (bfloat16)" in out
    assert "layout: 64 GPUs = dp 8 x cp 8" in out and "CP slabs of 131,072 tokens x 8" in out
    assert "weights (FSDP2 shard, 1/64)" in out and f"{shard:.2f} GiB" in out
    for line in ("root gathered", "decoder layers gathered", "residual streams", "largest op", "peak", "fits b200"):
        assert line in out, line
    assert "dry run OK: nothing was scored" in out
    # one 8-GPU node: 73 GiB of weights per rank + a 128k slab's forward fit a B200, not an H200
    assert main(["eval", "--checkpoint", "glm53-flash", "--seq-len", "1M", "--nproc", "8", "--cp", "8",
                 "--dry-run"]) == 0
    assert "fits b200" in (out := capsys.readouterr().out) and "too large for h200" in out
    # too few GPUs for the model: said, with what to change
    assert main(["eval", "--checkpoint", "glm53-flash", "--seq-len", "1M", "--nproc", "4", "--cp", "4",
                 "--dry-run"]) == 0
    assert "too large for every GPU listed" in capsys.readouterr().out
    # --strands both and --context: the forward work it adds (1M windows; targets 128k; L 1k + 64k)
    assert main(["eval", "--checkpoint", "glm53-flash", "--seq-len", "1M", "--nproc", "64", "--cp", "8",
                 "--strands", "both", "--context", "1k,64k", "--dry-run"]) == 0
    work = 2**20 + 2**20 + 2 * 2**17 + 2**10 + 2**16
    assert f"forward passes: {work:,} tokens in all" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", "glm53-flash", "--nproc", "64", "--cp", "8", "--dry-run"]) == 2
    assert "--dry-run without --shards plans one window of --seq-len tokens" in capsys.readouterr().err


def test_dry_run_of_a_checkpoint_on_shards(evaluated, tmp_path, capsys):
    argv = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards), "--out",
            str(tmp_path / "e"), "--nproc", "2", "--cp", "2", "--max-windows", "3", "--dry-run", "--device", "cpu"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(float32)" in out and "3 windows" in out and "layout: 2 CPU processes = dp 1 x cp 2" in out
    assert "slabs of 512 tokens x 2" in out
    assert not (tmp_path / "e").exists()


def _cli(argv: list[str]) -> None:
    """The CLI's eval command, letting its GenomeLMError through (main() would print it)."""
    from genome_lm.cli import build_parser

    args = build_parser().parse_args(argv)
    args.func(args)


@pytest.mark.slow
def test_crashed_worker_keeps_scored_windows_and_rerun_finishes(evaluated, tmp_path, monkeypatch, step_callbacks):
    out = tmp_path / "e"
    argv = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards), "--out", str(out),
            "--max-windows", str(N_WINDOWS), "--nproc", "2"]
    monkeypatch.setenv("TQDM_DISABLE", "1")
    step_callbacks(KillAt(1, rank=1))  # rank 1 dies after the first round (windows 0 and 1)
    with pytest.raises(GenomeLMError, match=r"--nproc 2: rank 1 failed: died without an error message.*"
                                            r"Windows scored so far are kept in .*rerun the same command"):
        _cli(argv)
    assert not out.exists()
    assert 1 <= len(list(cache_dir_for(out).glob("w*.npz"))) <= 2
    callbacks.clear()
    assert main(argv) == 0
    assert max_nll_diff(out, evaluated.eval0) <= ATOL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


@pytest.mark.slow
def test_ray_two_cpu_workers_equal_one_process(evaluated, tmp_path):
    import ray  # a dependency of genome_lm (--ray): missing, it is a failure, not a skip
    out = tmp_path / "e"
    try:
        assert main(["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards), "--out",
                     str(out), "--max-windows", str(N_WINDOWS), "--ray", "--nproc", "2"]) == 0
    finally:
        ray.shutdown()
    assert max_nll_diff(out, evaluated.eval0) <= ATOL
    assert load_summary(out)["config"]["parallel"] == {"world": 2, "dp": 2, "cp": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]
