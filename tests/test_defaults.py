"""Each default lives once (docs/architecture.md, Where each default lives): the planner plans with the
experiment's own config sections, and eval's config, the streaming engine and the export command start
from the numbers of their source, read here from that source (settings.py, the functions that use them)."""

import inspect

import pytest

from genome_lm.cli import ExportParams
from genome_lm.config import BlockSizes
from genome_lm.eval import ablation, scoring, stats
from genome_lm.eval.compare import compare_evals
from genome_lm.eval.config import EvalConfig
from genome_lm.model.streaming import score_streaming
from genome_lm.plan.command import PlanParams, build
from genome_lm.plan.planner import make_plan
from genome_lm.settings import DEFAULTS, STREAMING_CHUNK_TOKENS
from genome_lm.sizes import DEFAULT_MAX_SHARD_BYTES
from genome_lm.train.checkpoint import export_checkpoint

EXP_1M = "experiments/glm53flash_1m_64xb200.yaml"


def default_of(fn, name: str):
    return inspect.signature(fn).parameters[name].default


@pytest.mark.parametrize("key, value", [
    ("memory.moe_block_tokens", "8k"), ("memory.dsa_block_queries", "512"), ("memory.loss_chunk_tokens", "64k"),
    ("memory.kda_head_block", "0"), ("memory.offload_keep_last", "0"), ("memory.moe_recompute", "false"),
    ("memory.recompute", "selective"), ("memory.offload_layer_inputs", "false"), ("parallel.cp", "16"),
    ("parallel.ep", "1"), ("parallel.reduce_dtype", "float32"), ("parallel.backward_prefetch", "1"),
    ("train.optimizer_state_dtype", "float32"), ("train.micro_batch", "2"), ("train.grad_accum", "2"),
])
def test_every_config_key_the_planner_reads_changes_the_plan(key, value):
    """The planner's layout is the experiment's own memory, parallel and train sections: a --set of any
    key it models changes the planned peak, host memory or step time of the 1M reference run."""
    def plan(*sets: str):
        shape, layout, cluster, assume, _ = build(PlanParams(experiment=EXP_1M, gpus=64, overrides=list(sets)))
        p = make_plan(shape, layout, cluster, assume)
        return p.memory.phases, p.host_bytes_per_gpu, p.step_time_s

    extra = ["memory.recompute_layers=[dsa, moe]"] if value == "selective" else []
    assert plan() != plan(f"{key}={value}", *extra)


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
