"""`parallelize` applies long-context classes -> CP -> recompute/offload -> FSDP2; out of that order
the result is the same (where the steps commute) or a clear error, never a silent change.
(CP after recompute, with 2 ranks: tests/parallel/test_cp.py.)"""

import pytest
import torch

from genome_lm.config import MemoryConfig, ParallelConfig
from genome_lm.model import apply_long_context
from genome_lm.parallel import apply_context_parallel, apply_fsdp
from genome_lm.parallel.mesh import init_parallel
from genome_lm.train.parallelize import apply_recompute, parallelize
from tests.helpers import tiny_model

SIZES = dict(dsa_block_queries=16, moe_block_tokens=64, loss_chunk_tokens=48)


def _loss_and_grads(model):
    x = torch.randint(0, 5, (1, 90), generator=torch.Generator().manual_seed(1))
    out = model(x, labels=x)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("offload", [False, True])
def test_recompute_before_long_context_is_the_same(offload):
    memory = MemoryConfig(recompute="per-layer", offload_layer_inputs=offload, **SIZES)
    loss, grads = _loss_and_grads(parallelize(tiny_model(), memory))
    model = tiny_model()
    apply_recompute(model, memory)  # decoder layers recompute whatever their sub-modules become
    apply_long_context(model, **SIZES)
    loss2, grads2 = _loss_and_grads(model)
    assert torch.equal(loss, loss2) and grads.keys() == grads2.keys()
    assert all(torch.equal(grads[n], grads2[n]) for n in grads)


def test_recompute_matches_no_recompute():
    loss, grads = _loss_and_grads(parallelize(tiny_model(), MemoryConfig(**SIZES)))
    selective = MemoryConfig(recompute="selective", recompute_layers=["kda", "dsa", "moe", "dense"], **SIZES)
    loss2, grads2 = _loss_and_grads(parallelize(tiny_model(), selective))
    assert torch.equal(loss, loss2) and all(torch.equal(grads[n], grads2[n]) for n in grads)


def test_out_of_order_steps_raise():
    model = tiny_model()
    with pytest.raises(RuntimeError, match="apply_long_context first"):
        apply_context_parallel(model)
    apply_recompute(model, MemoryConfig(recompute="selective", recompute_layers=["kda"], offload_layer_inputs=True))
    with pytest.raises(TypeError, match="before recompute and FSDP2"):
        apply_long_context(model)

    par = init_parallel(ParallelConfig(), torch.device("cpu"), sharded=True)
    try:
        model = tiny_model()
        apply_fsdp(model, par.fsdp_mesh)
        with pytest.raises(RuntimeError, match="recompute before FSDP2"):
            apply_recompute(model, MemoryConfig(recompute="per-layer"))
        with pytest.raises(TypeError, match="before recompute and FSDP2"):
            apply_long_context(model)
    finally:
        par.shutdown()


@pytest.mark.parametrize("keep", [0, 1, 2])
def test_offload_keep_last_leaves_the_last_layers_on_the_device(keep):
    """memory.offload_keep_last: the last N layers are plain checkpoints (input kept on the device),
    the others offloaded; loss and gradients equal recompute without offload."""
    from genome_lm.train.parallelize import _OffloadedRecompute

    memory = MemoryConfig(recompute="per-layer", offload_layer_inputs=True, offload_keep_last=keep, **SIZES)
    model = parallelize(tiny_model(), memory)
    layers = list(model.model.layers)
    offloaded = [isinstance(layer, _OffloadedRecompute) for layer in layers]
    assert offloaded == [i < len(layers) - keep for i in range(len(layers))]
    loss, grads = _loss_and_grads(model)
    loss2, grads2 = _loss_and_grads(parallelize(tiny_model(), MemoryConfig(recompute="per-layer", **SIZES)))
    assert torch.equal(loss, loss2) and all(torch.equal(grads[n], grads2[n]) for n in grads)
