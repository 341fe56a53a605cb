"""Context parallelism: loss and every parameter gradient equal the single-process run.

One launch of 4 gloo processes covers CP = 4 (the world) and CP = 2 (two groups of 2: one
plain, one with per-layer recompute + layer-input offload, whose backward replays the CP
layers and their collectives, applied before and after CP). T = 203 is neither a multiple of the KDA chunk (64), of the
k-pool (4) nor of cp; T = 7 gives slabs of 1-2 tokens, shorter than the conv window (3 tokens
of history), so conv tails and KDA states cross several ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from genome_lm.errors import GenomeLMError
from genome_lm.parallel import slab_bounds
from tests.helpers import assert_grads_close, spawn, tiny_model

CASES = {"T203": (2, 203), "T7": (1, 7)}  # name -> (B, T)
RTOL = 1e-4  # per tensor: max |grad - ref| / max |ref|


def _batch(B: int, T: int):
    ids = torch.randint(0, 5, (B, T), generator=torch.Generator().manual_seed(T))
    labels = ids.clone()
    labels[:, ::7] = -100  # unscored targets, also at slab boundaries
    return ids, labels


def _model(recompute: str = "none", cp_group=None, cp: int = 1):
    """glm53-tiny through `parallelize` (long-context ops -> CP over `cp_group` -> recompute), no FSDP."""
    from types import SimpleNamespace

    from genome_lm.config import MemoryConfig
    from genome_lm.train.parallelize import parallelize

    model = tiny_model()
    memory = MemoryConfig(recompute=recompute, offload_layer_inputs=recompute != "none", dsa_block_queries=16,
                          moe_block_tokens=64, loss_chunk_tokens=48)
    layout = SimpleNamespace(cp=cp, dp=1, cp_group=cp_group, distributed=False, sharded=False) if cp > 1 else None
    return parallelize(model, memory, layout)


def _model_cp_last(cp_group):
    """As `_model("per-layer", ...)`, but CP applied after recompute + offload (out of
    `parallelize`'s order): the layers look up their CP context when called, so it is the same."""
    from genome_lm.config import MemoryConfig
    from genome_lm.model import apply_long_context
    from genome_lm.parallel import apply_context_parallel
    from genome_lm.train.parallelize import apply_recompute

    model = apply_long_context(tiny_model(), dsa_block_queries=16, moe_block_tokens=64, loss_chunk_tokens=48)
    apply_recompute(model, MemoryConfig(recompute="per-layer", offload_layer_inputs=True))
    apply_context_parallel(model, cp_group)
    return model


def _run(model, ids, labels):
    out = model(ids, labels=labels, return_per_token_nll=True)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": out.loss.detach(), "nll": out.per_token_nll.detach(), "grads": grads}


def _cp_worker(rank: int, world: int, out_dir: str) -> None:
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    if rank == 0:  # single-process references
        for name, (B, T) in CASES.items():
            torch.save(_run(_model(), *_batch(B, T)), f"{out_dir}/ref_{name}.pt")

    def cp_run(tag: str, group, cases, recompute="none", make=None):
        for name in cases:
            model = make(group) if make else _model(recompute, group, dist.get_world_size(group))
            res = _run(model, *_batch(*CASES[name]))
            for g in res["grads"].values():  # CP ranks share parameters: their gradients add up
                dist.all_reduce(g, group=group)
            if dist.get_rank(group) == 0:
                torch.save(res, f"{out_dir}/{tag}_{name}.pt")

    cp_run("cp4", None, CASES)
    if rank < 2:
        cp_run("cp2", pairs[0], CASES)
    else:
        cp_run("cp2recompute", pairs[1], ["T203"], recompute="per-layer")
        cp_run("cp2cplast", pairs[1], ["T203"], make=_model_cp_last)


def _compare(got: dict, ref: dict, what: str) -> float:
    torch.testing.assert_close(got["loss"], ref["loss"], rtol=1e-5, atol=1e-6, msg=f"{what}: loss")
    torch.testing.assert_close(got["nll"], ref["nll"], rtol=1e-4, atol=1e-5, msg=f"{what}: per-token NLL")
    return assert_grads_close(what, got["grads"], ref["grads"], RTOL)


def test_cp_parity_2_and_4_ranks(tmp_path):
    spawn(_cp_worker, 4, str(tmp_path), timeout=600)
    runs = [("cp4", name) for name in CASES] + [("cp2", name) for name in CASES] + [("cp2recompute", "T203")]
    runs += [("cp2cplast", "T203")]
    for tag, name in runs:
        got = torch.load(tmp_path / f"{tag}_{name}.pt")
        ref = torch.load(tmp_path / f"ref_{name}.pt")
        worst = _compare(got, ref, f"{tag} {name}")
        print(f"{tag} {name}: loss {float(got['loss']):.6f} (ref {float(ref['loss']):.6f}), worst grad {worst:.1e}")


def test_slab_bounds():
    assert slab_bounds(1 << 20, 8) == [i * (1 << 17) for i in range(9)]
    assert slab_bounds(203, 2) == [0, 128, 203]  # whole 64-token chunks, the last slab takes the rest
    assert slab_bounds(203, 4) == [0, 50, 101, 152, 203]  # too short for 64-token slabs: even split
    assert slab_bounds(7, 4) == [0, 1, 3, 5, 7]
    with pytest.raises(GenomeLMError, match="cannot be split over parallel.cp=4"):
        slab_bounds(3, 4)
