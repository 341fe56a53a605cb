"""The quick demo runs end to end (fast; part of the default suite), and its training losses and
held-out mean NLL match the committed golden file `tests/assets/losses/demo_quick.json` (as
torchtitan keeps golden loss files). After a change that is meant to move them, regenerate it:
`GENOME_LM_UPDATE_GOLDEN=1 pytest tests/test_demo.py` writes the file and checks nothing against it
(the test reports itself skipped); a run without the variable then checks the demo against it. Say
why in the commit."""

import json
import os
from pathlib import Path

import pytest

from genome_lm.cli import main as cli_main
from genome_lm.eval import load_summary
from genome_lm.genome import load_shards

GOLDEN = Path(__file__).parent / "assets" / "losses" / "demo_quick.json"


def main(argv: list[str]) -> int:
    """`genome-lm demo ARGV`."""
    return cli_main(["demo", *argv])


GOLDEN_TOL = dict(rel=1e-4)  # same arithmetic; room for another CPU's float summation order


def demo_losses(root: Path) -> dict:
    def losses(run: str) -> list[float]:
        lines = (root / "runs" / run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines]

    names = ("base", "longctx", "shortctx")
    return {**{name: losses(f"demo_quick_{name}") for name in names},
            "eval_mean_nll": {name: load_summary(root / "evals" / f"demo_quick_{name}")["overall"]["mean_nll"]
                              for name in names}}


def files(root: Path) -> dict[Path, tuple[int, int, int]]:
    """Every file under `root`: (inode, mtime in ns, size), which a rewrite or a replacement changes."""
    return {p.relative_to(root): (st.st_ino, st.st_mtime_ns, st.st_size)
            for p in sorted(root.rglob("*")) if p.is_file() for st in [p.stat()]}


def test_quick_demo_end_to_end(tmp_path, capsys):
    assert main(["--quick", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "genome_lm demo (quick) finished in" in out and "largest relative change: context [" in out
    # the three-way table: each model's loss with its CI, then the three paired differences
    assert "Is the gain from context, or from more training?" in out
    for line in ("base ", "short-context fine-tune", "long-context fine-tune", "short - base (more training)",
                 "long - base (training + context)", "long - short (context)", "gain attributable to context"):
        assert line in out, line
    # the three models' context ablation (the same targets given L = 256 and 1k), both strands, leakage
    assert "Does the model read distant sequence?" in out and "From L = 256 to 1,024:" in out
    assert out.count("reverse complement") >= 3 and "per-base Pearson r" in out
    assert "leakage mask" in out
    for name in ("base", "longctx", "shortctx"):
        s = load_summary(tmp_path / "evals" / f"demo_quick_{name}")
        assert [e["L"] for e in s["context_ablation"]["by_length"]] == [256, 1024]
        assert s["context_ablation"]["span"]["tokens"] == s["context_ablation"]["target_tokens"] > 0
        assert set(s["strands"]) >= {"forward", "reverse", "average", "agreement"}
    shards = tmp_path / "shards" / "demo_quick"
    assert len(load_shards(shards, "train")) > 0 and len(load_shards(shards, "eval")) > 0
    for d in ("evals/demo_quick_base", "evals/demo_quick_longctx", "evals/demo_quick_shortctx",
              "evals/demo_quick_shortctx_vs_longctx/compare.json"):
        assert (tmp_path / d).exists(), d
    html = (tmp_path / "reports" / "demo_quick.html").read_text()
    assert html.count("data:image/png;base64,") >= 5 and "Is the gain from context, or from more training?" in html
    assert "Context ablation" in html
    # the control trained on as many tokens as the long-context fine-tune, at the base's context
    tokens = {name: [json.loads(line)["tokens"] for line in
                     (tmp_path / "runs" / f"demo_quick_{name}" / "metrics.jsonl").read_text().splitlines()]
              for name in ("longctx", "shortctx")}
    assert tokens["shortctx"] == tokens["longctx"] == [2048] * 3
    got = demo_losses(tmp_path)
    # a rerun reuses the outputs of steps 1-8 (genome, shards, runs, evals) untouched; only the
    # compares (step 9) and the report (step 10) are written again
    before = files(tmp_path)
    assert main(["--quick", "--root", str(tmp_path)]) == 0
    assert "already complete" in capsys.readouterr().out
    after = files(tmp_path)
    rewritten = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert rewritten and all(p.parts[0] == "reports" or p.parts[:1] == ("evals",) and "_vs_" in p.parts[1]
                             for p in rewritten), rewritten
    # another fine-tune seed: the same base, both fine-tunes again, compared pooled over seeds 1 and 2
    assert main(["--quick", "--root", str(tmp_path), "--set", "extra_seeds=2"]) == 0
    out = capsys.readouterr().out
    assert "Over fine-tune seeds 1,2 (extra_seeds)" in out and "replicates: 2 pairs" in out
    assert "long - short (context)" in out.split("Over fine-tune seeds")[1]
    base_vs_long = json.loads((tmp_path / "evals" / "demo_quick_base_vs_longctx_seeds" / "compare.json").read_text())
    assert base_vs_long["a"]["dirs"] == [str(tmp_path / "evals" / "demo_quick_base")] * 2  # the one base, each seed
    rep = json.loads((tmp_path / "evals" / "demo_quick_shortctx_vs_longctx_seeds" / "compare.json").read_text())
    assert rep["b"]["dirs"] == [str(tmp_path / "evals" / f"demo_quick_longctx{s}") for s in ("", "_seed2")]
    seed1 = json.loads((tmp_path / "evals" / "demo_quick_shortctx_vs_longctx" / "compare.json").read_text())
    assert rep["replicates"]["pairs"][0]["diff"] == pytest.approx(seed1["overall"]["diff"])
    seed2 = [json.loads(line)["loss"] for line in
             (tmp_path / "runs" / "demo_quick_longctx_seed2" / "metrics.jsonl").read_text().splitlines()]
    assert len(seed2) == 3 and seed2 != got["longctx"]  # trained again, on other batches
    html = (tmp_path / "reports" / "demo_quick.html").read_text()
    # long vs short in the section on context vs more training, the two against the base under Tables; none twice
    assert html.count("replicate pairs") == 3 and "Over 2 training seeds of both fine-tunes" in html
    if os.environ.get("GENOME_LM_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=2) + "\n")
        pytest.skip(f"wrote {GOLDEN.name}; the losses are checked against it by a run without GENOME_LM_UPDATE_GOLDEN")
    want = json.loads(GOLDEN.read_text())
    assert got["base"] == pytest.approx(want["base"], **GOLDEN_TOL)
    assert got["longctx"] == pytest.approx(want["longctx"], **GOLDEN_TOL)
    assert got["shortctx"] == pytest.approx(want["shortctx"], **GOLDEN_TOL)
    assert got["eval_mean_nll"] == pytest.approx(want["eval_mean_nll"], **GOLDEN_TOL)


def test_recipe_overrides_change_the_recipe_and_the_output_names():
    from genome_lm.demo import FULL, QUICK, recipe

    assert recipe() == (FULL, "demo") and recipe(quick=True) == (QUICK, "demo_quick")
    r, tag = recipe(overrides=["finetune_steps=1000", "model=glm53-mini", "window=8k"])
    assert (r.finetune_steps, r.model, r.window, r.base_steps) == (1000, "glm53-mini", "8k", FULL.base_steps)
    assert tag == "demo_finetune_steps-1000_model-glm53-mini_window-8k"
    r, tag = recipe(overrides=["extra_seeds=3,2"])  # more seeds add outputs and reuse the rest
    assert (r.seed_list(), tag) == ([3, 2], "demo")


@pytest.mark.parametrize("item, message", [("steps=3", "unknown recipe field steps; did you mean base_steps?"),
                                           ("base_steps", "NAME=VALUE"), ("train.steps=3", "NAME one of"),
                                           ("base_steps=many", "expected an integer"),
                                           ("eval_windows=0", "must be > 0"),
                                           ("extra_seeds=1,2", "other than 1")])
def test_recipe_override_errors_name_the_field(item, message, capsys, tmp_path):
    assert main(["--root", str(tmp_path), "--set", item]) == 2
    err = capsys.readouterr().err
    assert message in err and item in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("items, message", [
    (["window=abc"], "window: cannot read 'abc' as a size"),
    (["window=1k", "context=4k"], "context 4k is too long for window 1k: the ablation's targets are the last 1/8"),
    (["model=glm53-nope"], "model 'glm53-nope' is neither a preset"),
])
def test_a_recipe_later_steps_would_refuse_is_refused_before_any_work(items, message, capsys, tmp_path):
    assert main(["--quick", "--root", str(tmp_path), *[a for item in items for a in ("--set", item)]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not any(tmp_path.iterdir())  # no genome synthesized, no shards, no run


def test_experiments_come_from_the_checkout_else_the_installed_copy(tmp_path, monkeypatch):
    """`pip install .` (not editable) has no experiments/ beside the package: the data-files copy serves."""
    from genome_lm import demo
    from genome_lm.errors import GenomeLMError

    assert demo.experiments_dir() == demo.SOURCE_EXPERIMENTS
    installed = tmp_path / "share" / "genome_lm" / "experiments"
    monkeypatch.setattr(demo, "SOURCE_EXPERIMENTS", tmp_path / "no-checkout")
    monkeypatch.setattr(demo, "INSTALLED_EXPERIMENTS", installed)
    with pytest.raises(GenomeLMError, match="make demo"):
        demo.experiments_dir()
    installed.mkdir(parents=True)
    (installed / "demo_base.yaml").write_text("model: {}\n")
    assert demo.experiments_dir() == installed


def test_the_time_left_scales_the_time_so_far_by_the_steps_to_come(caplog):
    from genome_lm.demo import Timeline

    t = [0.0]
    timeline = Timeline({1: 0.1, 2: 0.3, 3: 0.6}, clock=lambda: t[0])
    t[0] = 50.0
    assert timeline.done(1, ran=False) == "    [1/10] done: 50 s so far"  # reused: no rate yet
    t[0] = 120.0
    assert timeline.done(2) == "    [2/10] done: 2.0 min so far, about 4.0 min left"  # 0.3 took 120 s; 0.6 to come
    t[0] = 360.0
    assert timeline.done(3) == "    [3/10] done: 6.0 min so far"
