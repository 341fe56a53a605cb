"""Breakdown arithmetic on configs whose numbers can be worked out by hand."""

from __future__ import annotations

import pytest

from genome_lm.plan import activations as act
from genome_lm.plan.activations import layer_ops
from genome_lm.plan.hardware import Assumptions, GiB, MiB, make_cluster
from genome_lm.plan.layout import Layout
from genome_lm.plan.memory import kept, pow2
from genome_lm.plan.planner import make_plan
from genome_lm.plan.shapes import model_shape
from genome_lm.sizes import parse_size


@pytest.fixture(scope="module")
def flash():
    return model_shape("glm53-flash", "bfloat16")


@pytest.fixture(scope="module")
def tiny():
    return model_shape("glm53-tiny", "float32")


def reference(seq_len: int, **changes) -> Layout:
    start = Layout(seq_len).replace(cp=8, dp=8, recompute="per-layer", offload_layer_inputs=True, moe_recompute=True,
                                    moe_block_tokens=65536, dsa_block_queries=1024, loss_chunk_tokens=4096)
    return start.replace(**changes)


def test_parse_size_of_bytes_and_pow2():
    assert parse_size("180GiB", "x") == 180 * GiB
    assert parse_size("141GB", "x") == 141 * 10**9
    assert parse_size("2TiB", "x") == 2 * 1024 * GiB
    assert parse_size("1.5GiB", "x") == 3 * GiB // 2
    assert [pow2(n) for n in (1, 2, 3, 4096, 4097)] == [1, 2, 4, 4096, 8192]


def test_flash_shape_matches_the_published_architecture(flash):
    kinds = [lay.kind for lay in flash.layers]
    assert len(kinds) == 45 and sum(k.startswith("kda") for k in kinds) == 34
    assert kinds[:3] == ["kda+dense"] * 3 and kinds[3] == "dsa+moe"
    assert (flash.D, flash.S, flash.V, flash.experts, flash.top_k) == (4096, 4, 154880, 288, 8)
    # 1M tokens x 4096 x 4 streams x 2 bytes = 32 GiB per layer input (DESIGN.md)
    assert act.layer_input(flash, 2**20) == 32 * GiB


def test_host_memory_of_offloaded_inputs_by_hand(flash):
    """44 of the 45 layers (the last keeps its input on the device: memory.offload_keep_last 1) x
    [131072, 4, 4096] bf16 = 4 GiB each (already a power of two), plus the mask (128 KiB), position
    ids and input ids (1 MiB each) that the wrapped layer also parks; all 45 with keep_last 0."""
    plan = make_plan(flash, reference(2**20), make_cluster("b200", 64))
    assert plan.host_bytes_per_gpu == 44 * (4 * GiB + 128 * 1024 + 2 * MiB)
    unrounded = make_plan(flash, reference(2**20), make_cluster("b200", 64), Assumptions(pinned_pow2=False))
    assert unrounded.host_bytes_per_gpu == 44 * (4 * GiB + 131072 * 17)
    every = make_plan(flash, reference(2**20).replace(offload_keep_last=0), make_cluster("b200", 64))
    assert every.host_bytes_per_gpu == 45 * (4 * GiB + 128 * 1024 + 2 * MiB)
    assert every.peak_gpu_bytes <= plan.peak_gpu_bytes


def test_persistent_shards_by_hand(flash):
    """FSDP2 over dp x cp = 64: float32 master weights (4 bytes per parameter) /64, the routed experts
    as whole experts per rank (288 over 64: 5, FSDP2 pads dim 0), float32 AdamW states 2x that,
    whatever the model's (bf16) dtype; bf16 moments half of that."""
    plan = make_plan(flash, reference(2**18), make_cluster("b200", 64))
    b = plan.memory.breakdown
    experts = sum(lay.expert_count for lay in flash.layers)
    held = (flash.param_count - experts) / 64 + experts / 288 * 5
    assert b["parameters"] == pytest.approx(4 * held, rel=1e-6)
    assert b["optimizer_states"] == 2 * b["parameters"]
    assert b["fsdp_root_unsharded"] == flash.root_param_bytes
    assert sum(b.values()) == plan.peak_gpu_bytes
    bf16 = make_plan(flash, reference(2**18, optimizer_state_dtype="bfloat16"), make_cluster("b200", 64))
    bf16 = bf16.memory.breakdown
    assert bf16["optimizer_states"] == b["parameters"]  # train.optimizer_state_dtype: bfloat16
    assert bf16["parameters"] == b["parameters"]


def test_kept_per_strategy_by_hand(tiny):
    """glm53-tiny fp32, 1024 tokens: a layer input is 1024 x 4 x 64 x 4 bytes = 1 MiB."""
    layout = Layout(seq_len=1024)
    layer = tiny.layers[0]
    ops = layer_ops(tiny, layer, layout, "torch", 1.0)
    assert act.layer_input(tiny, 1024) == MiB
    full = sum(op.saved_bytes for op in ops)
    body = act.layer_body(tiny, layer, layout, "torch", 1.0)
    assert full == MiB + sum(body.values())  # the ops carry exactly the saved terms
    assert kept(ops, tiny, layer, layout, Assumptions()) == (full, 0, 0)
    per_layer = layout.replace(recompute="per-layer")
    assert kept(ops, tiny, layer, per_layer, Assumptions()) == (MiB, 0, 0)
    off = per_layer.replace(offload_layer_inputs=True)
    assert kept(ops, tiny, layer, off, Assumptions())[0] == 0
    assert kept(ops, tiny, layer, off, Assumptions(offload_keeps_device_input=True))[0] == MiB


def test_frame_terms_by_hand(tiny):
    """Per token, fp32, S=4, D=64: mid stream 4*4*64; two norm inputs 2*(4*64) (ops/norm keeps
    only its input); two combines 2*(4*64 + 4*4 + 4*16)."""
    fr = act.frame(tiny, 1, hc_recompute=True)
    assert fr == {"mid_stream": 1024, "norms": 2 * 256, "hc_combine": 2 * 336}


def test_offload_trades_device_for_host_memory(flash):
    cluster = make_cluster("b200", 64)
    on = make_plan(flash, reference(2**18), cluster)
    off = make_plan(flash, reference(2**18, offload_layer_inputs=False), cluster)
    layer_input = act.layer_input(flash, 2**15)
    # without offload the 44 earlier layers keep their inputs on the device at the last layer's backward
    assert off.peak_gpu_bytes > on.peak_gpu_bytes
    assert off.host_bytes_per_gpu == 0 and on.host_bytes_per_gpu >= 44 * layer_input  # the last stays
    assert on.step_time_s > off.step_time_s  # the copies back are on the critical path


def test_smaller_dsa_blocks_lower_the_dsa_backward(flash):
    """With 4k-query blocks the first DSA layer's backward peaks in its sparse attention; 8x smaller
    blocks shrink the gathered-rows transient about 8x, by more than 50 GiB."""
    cluster = make_cluster("b200", 64)

    def layer3_backward(block: int) -> tuple[str, int, int]:
        plan = make_plan(flash, reference(2**20, dsa_block_queries=block, moe_block_tokens=8192), cluster)
        where, peak = max(((w, b) for w, b in plan.memory.phases if w.startswith("backward of layer 3 ")),
                          key=lambda wb: wb[1])
        return where, peak, plan.peak_gpu_bytes

    big_where, big, big_peak = layer3_backward(4096)
    small_where, small, small_peak = layer3_backward(512)
    assert big_where.endswith("dsa_attention")
    assert big - small > 50 * GiB and small_peak <= big_peak


def test_expert_parallel_shrinks_fsdp_buffers_and_imbalance_grows_moe(flash):
    cluster = make_cluster("b200", 64)
    ep1 = make_plan(flash, reference(2**18), cluster)
    ep8 = make_plan(flash, reference(2**18, ep=8), cluster)
    assert ep8.memory.breakdown.get("fsdp_buffers", 0) < ep1.memory.breakdown.get("fsdp_buffers", 0)
    hot = make_plan(flash, reference(2**18, ep=8, moe_recompute=False), cluster, Assumptions(expert_imbalance=4))
    even = make_plan(flash, reference(2**18, ep=8, moe_recompute=False), cluster, Assumptions(expert_imbalance=1))
    assert hot.memory.activations_by_layer_type["dsa+moe"] > even.memory.activations_by_layer_type["dsa+moe"]
    assert hot.step_time_s > even.step_time_s


def moe_backward_buffers(flash, gpus: int, **changes) -> int:
    """FSDP2 buffers at layer 3's MoE backward (64k tokens; no backward prefetch)."""
    layout = reference(2**16, cp=4, dp=gpus // 4, backward_prefetch=0, moe_recompute=False, moe_block_tokens=4096,
                       dsa_block_queries=256, **changes)
    plan = make_plan(flash, layout, make_cluster("h200", gpus))
    return plan.memory.phase_parts["backward of layer 3 (dsa+moe): moe"]["fsdp_buffers"]


def test_fsdp2_buffers_of_a_moe_backward_by_hand(flash):
    """Layer 3's MoE backward holds FSDP2's reduce-scatter input of layer 4 (kept until the next group
    reduce-scatters), in the reduce dtype: reducing in float32 holds layer 4's bf16 parameters once more
    than bfloat16. Without expert parallelism: layer 3's gathered parameters and gradients, that input
    and the LM head's gradient. Under ep the experts are gathered padded (288 / ep 4 = 72 over 32 / 4 = 8
    ranks: 9 each, none; over 64 / 4 = 16: 5 each, 80) and an all-gather of them is alive."""
    layer3, layer4 = flash.layers[3].param_bytes, flash.layers[4].param_bytes
    f32, bf16 = (moe_backward_buffers(flash, 16, reduce_dtype=d) for d in ("float32", "bfloat16"))
    assert f32 - bf16 == layer4
    assert bf16 == 2 * layer3 + layer4 + flash.lm_head_bytes
    expert = flash.layers[3].expert_bytes // 288
    even, padded = (moe_backward_buffers(flash, gpus, reduce_dtype="bfloat16", ep=4) for gpus in (32, 64))
    assert padded - even == 2 * (80 - 72) * expert  # the gathered experts and their all-gather, 8 experts more


def test_tokens_per_s_is_global_tokens_over_step_time(flash):
    plan = make_plan(flash, reference(2**20), make_cluster("b200", 64))
    assert plan.tokens_per_s == pytest.approx(8 * 2**20 / plan.step_time_s)
    assert plan.time.model_flops_per_token == 6 * (flash.counts["active"] - flash.counts["embeddings"])


def test_cpu_plan_adds_the_measured_baseline(tiny):
    plan = make_plan(tiny, Layout(seq_len=4096), None, process_baseline_bytes=400 * MiB)
    assert plan.peak_gpu_bytes == plan.memory.peak_bytes + 400 * MiB
    assert plan.memory.breakdown.get("parameters", 0) == 0  # part of the measured baseline on a CPU
