"""The quick demo runs end to end (fast; part of the default suite)."""

from genome_lm.demo import main
from genome_lm.genome import load_shards


def test_quick_demo_end_to_end(tmp_path, capsys):
    assert main(["--quick", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and "relative change" in out.lower() or "largest" in out
    shards = tmp_path / "shards" / "demo_quick"
    assert len(load_shards(shards, "train")) > 0 and len(load_shards(shards, "eval")) > 0
    for d in ("evals/demo_quick_base", "evals/demo_quick_longctx"):
        assert (tmp_path / d / "summary.json").exists()
    html = (tmp_path / "reports" / "demo_quick.html").read_text()
    assert html.count("data:image/png;base64,") >= 3
    # a rerun reuses every step
    assert main(["--quick", "--root", str(tmp_path)]) == 0
    assert "already complete" in capsys.readouterr().out
