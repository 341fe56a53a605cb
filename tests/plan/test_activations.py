"""The planner's saved-activation terms against what autograd really saves on glm53-tiny.

A forward with saved-tensor hooks records every storage autograd keeps (parameters excluded,
each storage once, attributed to the decoder layer whose forward first saved it). The planner's
`layer_input + layer_body` for that layer must match within 1% (the selection of DSA layers is
kept by the attention's context object, not through autograd, so it is left out here).
Outside the layers: input ids, final norm and hidden state, loss targets and log-sum-exp.
"""

from __future__ import annotations

import pytest
import torch

from genome_lm.model import apply_long_context, build, preset_config
from genome_lm.plan import activations
from genome_lm.plan.layout import Layout
from genome_lm.plan.shapes import shape_of
from genome_lm.settings import ALL_OPS

T = 1024


def saved_by_layer(model, T: int) -> dict[int, int]:
    """Bytes of the storages first saved during each decoder layer's forward (-1: outside)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    current = [-1]
    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_pre_hook(lambda mod, args, i=i: current.__setitem__(0, i)))
        hooks.append(layer.register_forward_hook(lambda mod, args, out: current.__setitem__(0, -1)))
    seen: dict[int, int] = {}
    owner: dict[int, int] = {}
    keep = []  # every saved tensor stays referenced, so no recorded address is reused by another storage

    def pack(t):
        keep.append(t)
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in params and ptr not in seen and st.nbytes():
            seen[ptr], owner[ptr] = st.nbytes(), current[0]
        return t

    ids = torch.randint(0, 5, (1, T))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids)
    for h in hooks:
        h.remove()
    out: dict[int, int] = {}
    for ptr, nbytes in seen.items():
        out[owner[ptr]] = out.get(owner[ptr], 0) + nbytes
    return out


@pytest.mark.parametrize("dtype, moe_recompute, hc_recompute", [
    ("float32", False, True), ("float32", True, False), ("bfloat16", False, False), ("bfloat16", True, True)])
def test_saved_bytes_per_layer_match_autograd(dtype, moe_recompute, hc_recompute):
    torch.manual_seed(0)
    model = build("glm53-tiny", dtype=dtype).model
    # without "hc": upstream's hyper-connections, keeping their Sinkhorn intermediates
    apply_long_context(model, moe_recompute=moe_recompute, moe_block_tokens=1024, dsa_block_queries=512,
                       ops=ALL_OPS if hc_recompute else tuple(op for op in ALL_OPS if op != "hc"))
    measured = saved_by_layer(model, T)
    m = shape_of(model, "glm53-tiny", dtype)
    layout = Layout(T, hc_recompute=hc_recompute).replace(moe_recompute=moe_recompute, moe_block_tokens=1024,
                                                          dsa_block_queries=512)
    for layer in m.layers:
        body = activations.layer_body(m, layer, layout, backend="torch", imbalance=1.0)
        body.pop("dsa_selection", None)
        predicted = activations.layer_input(m, T) + sum(body.values())
        got = measured[layer.index]
        assert abs(predicted - got) <= 0.01 * got, (layer.kind, predicted / T, got / T, body)
    outside = sum(activations.outside_layers(m, T).values())
    assert abs(outside - measured[-1]) <= 0.01 * measured[-1]


@pytest.mark.parametrize("tokens, block, recompute", [(4096, 8192, False), (32768, 8192, False), (16384, 4096, True)])
def test_expert_parallel_moe_saves_what_the_planner_counts(tokens, block, recompute):
    """A real-width GLM-5.3-Flash MoE layer under expert parallelism (36 local experts of 288, ep 8, the
    busiest rank at 4x the mean rows) on fake tensors: the bytes its forward leaves for backward are the
    planner's `act.moe` within 0.5%; its forward's peak is at most the planner's (saved + forward
    transient) and within 10% of it, and so is its forward + backward peak (saved + backward transient +
    the layer's gradients)."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
    from genome_lm.model.ops.moe.ep import EPContext, ExpertParallelExperts
    from genome_lm.model.patch import use_fake_values
    from genome_lm.model.upstream import Glm5NextTextMoE
    from genome_lm.plan.activations import mlp_ops
    from genome_lm.plan.command import PlanParams, build
    from genome_lm.plan.rehearse import _fake_pg

    P = 8
    cfg = preset_config("glm53-flash")
    with torch.device("meta"):
        moe = Glm5NextTextMoE(cfg).to(torch.bfloat16)
    for name in ("gate_up_proj", "down_proj"):  # this rank's experts
        setattr(moe.experts, name, torch.nn.Parameter(getattr(moe.experts, name)[: cfg.n_routed_experts // P]))
    BlockedGlm5NextTextMoE.install(moe, block_tokens=block, recompute=recompute)
    _fake_pg(P, 0)
    try:
        ExpertParallelExperts.install(moe.experts, ep=EPContext(dist.group.WORLD, 0, P))
        use_fake_values(moe, 4.0)
        with FakeTensorMode(allow_non_fake_inputs=True):
            moe.to_empty(device="cpu")
            x = torch.randn(1, tokens, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
            tracker = MemTracker()
            tracker.track_external(moe, x)
            with tracker:
                before = tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
                y = moe(x)
                # the output [n, D] stands for the layer's input, which the planner counts as saved (moe_input)
                saved = tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"] - before
                forward_peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] - before
                y.backward(torch.ones_like(y))
            peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] - before
    finally:
        dist.destroy_process_group()
    sets = [f"data.seq_len={tokens * P}", f"memory.moe_block_tokens={block}", f"memory.moe_recompute={recompute}"]
    shape, layout, _, _, _ = build(PlanParams(experiment="experiments/glm53flash_512k_64xb200.yaml",
                                              overrides=sets, gpus=64))
    assert layout.tokens == tokens and layout.parallel.ep == P
    (op,) = mlp_ops(shape, shape.layers[3], layout, 4.0)
    assert saved == pytest.approx(op.saved_bytes, rel=0.005)
    # the forward's peak: what it keeps plus its largest transient (with recompute: the block's rebuilt
    # forward, which keeps nothing)
    assert 0.9 * (op.saved_bytes + op.fwd) < forward_peak <= op.saved_bytes + op.fwd, (forward_peak / 2**30,
                                                                                    op.fwd / 2**30)
    grads = sum(p.nbytes for p in moe.parameters())
    planned = op.saved_bytes + op.bwd + grads + y.nbytes  # and the output's gradient
    assert 0.9 * planned < peak <= planned, (peak / 2**30, planned / 2**30)
