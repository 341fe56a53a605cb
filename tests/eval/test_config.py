"""EvalConfig: training's long-context block sizes by default, overridable by flag, --set or --config."""

from genome_lm.cli import build_parser
from genome_lm.config import MemoryConfig
from genome_lm.eval.config import EvalConfig
from genome_lm.options import from_args

BLOCKS = ("moe_block_tokens", "dsa_block_queries", "loss_chunk_tokens")


def test_block_sizes_default_to_trainings():
    cfg, train = EvalConfig(checkpoint="c"), MemoryConfig()
    assert [getattr(cfg, k) for k in BLOCKS] == [getattr(train, k) for k in BLOCKS]


def test_flags_set_and_config_file(tmp_path):
    f = tmp_path / "eval.yaml"
    f.write_text("checkpoint: c\nshards: s\nmoe_block_tokens: 2k\nseq_len: 64k\n")
    args = build_parser().parse_args(["eval", "--config", str(f), "--loss-chunk-tokens", "1k",
                                      "--set", "dsa_block_queries=512", "--no-tf32"])
    cfg = from_args(EvalConfig, args)
    assert (cfg.moe_block_tokens, cfg.loss_chunk_tokens, cfg.dsa_block_queries) == (2048, 1024, 512)
    assert cfg.seq_len == 65536 and cfg.shards == "s" and cfg.tf32 is False and cfg.chunk_tokens == 4096
