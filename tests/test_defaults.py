"""Each default lives once (docs/architecture.md, Where each default lives): the planner's layout,
eval's config, the streaming engine and the export command start from the numbers of their source,
read here from that source (settings.py, the config models, the functions that use them)."""

import dataclasses
import inspect

from genome_lm.cli import ExportParams
from genome_lm.config import BlockSizes, MemoryConfig, ParallelConfig, TrainConfig
from genome_lm.eval import ablation, scoring, stats
from genome_lm.eval.compare import compare_evals
from genome_lm.eval.config import EvalConfig
from genome_lm.model.streaming import score_streaming
from genome_lm.model.weights.writer import DEFAULT_MAX_SHARD_BYTES
from genome_lm.plan.layout import MEMORY_KEYS, Layout
from genome_lm.settings import DEFAULTS, STREAMING_CHUNK_TOKENS
from genome_lm.train.export import export_checkpoint

BYTES = {"float32": 4, "bfloat16": 2}


def default_of(fn, name: str):
    return inspect.signature(fn).parameters[name].default


def test_block_sizes_are_the_settings():
    memory = MemoryConfig()
    for name in BlockSizes.model_fields:
        assert getattr(memory, name) == getattr(DEFAULTS, name), name
    assert memory.moe_recompute == DEFAULTS.moe_recompute


def test_every_planner_default_is_its_source():
    memory, parallel, train = MemoryConfig(), ParallelConfig(), TrainConfig.model_fields
    source = {name: getattr(memory, key) for name, key in MEMORY_KEYS.items()}
    source["recompute_layers"] = tuple(memory.recompute_layers)
    source |= {"cp": parallel.cp, "dp": 1, "ep": parallel.ep, "backward_prefetch": parallel.backward_prefetch,
               "reduce_bytes": BYTES[parallel.reduce_dtype], "micro_batch": train["micro_batch"].default,
               "grad_accum": train["grad_accum"].default,
               "state_bytes": BYTES[train["optimizer_state_dtype"].default],
               "kda_chunk": DEFAULTS.kda_chunk_size, "hc_recompute": "hc" in DEFAULTS.ops}
    layout = Layout(seq_len=1)
    fields = {f.name for f in dataclasses.fields(Layout)} - {"seq_len"}
    assert fields == set(source), "a Layout field without a source in this test (add it)"
    for name in sorted(fields):
        assert getattr(layout, name) == source[name], name


def test_every_eval_and_streaming_default_is_its_source():
    cfg = EvalConfig(checkpoint="c")
    for name in BlockSizes.model_fields:
        assert getattr(cfg, name) == getattr(DEFAULTS, name), name
    chunk = {"EvalConfig.chunk_tokens": cfg.chunk_tokens,
             "score_streaming": default_of(score_streaming, "chunk_tokens"),
             "score_piece": default_of(scoring.score_piece, "chunk_tokens"),
             "score_window": default_of(scoring.score_window, "chunk_tokens"),
             "score_ablation": default_of(ablation.score_ablation, "chunk_tokens")}
    assert set(chunk.values()) == {STREAMING_CHUNK_TOKENS}, chunk
    resamples = {"EvalConfig.resamples": cfg.resamples, "summarize": default_of(stats.summarize, "resamples"),
                 "compare_evals": default_of(compare_evals, "resamples")}
    assert set(resamples.values()) == {stats.DEFAULT_RESAMPLES}, resamples
    assert cfg.seed == stats.DEFAULT_SEED == default_of(stats.summarize, "seed")


def test_export_default_is_the_writers():
    params = ExportParams(checkpoint="c", out="o")
    assert params.max_shard_size == DEFAULT_MAX_SHARD_BYTES == default_of(export_checkpoint, "max_shard_bytes")
