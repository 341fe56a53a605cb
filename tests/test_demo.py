"""The quick demo runs end to end (fast; part of the default suite)."""

from genome_lm.demo import main
from genome_lm.genome import load_shards


def test_quick_demo_end_to_end(tmp_path, capsys):
    assert main(["--quick", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "finished" in out
    shards = tmp_path / "shards" / "demo_quick"
    assert len(load_shards(shards, "train")) > 0 and len(load_shards(shards, "eval")) > 0
    # a rerun reuses everything
    assert main(["--quick", "--root", str(tmp_path)]) == 0
    assert "already complete" in capsys.readouterr().out
