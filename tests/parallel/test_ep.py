"""Expert parallelism: loss and every gradient equal one process (fp32, rel <= 1e-5).

One launch of 4 gloo processes runs ep 2 (with dp 4: each rank its own batch), ep 4, and
ep 2 x cp 2 (dp 2); each through `parallelize` with FSDP2 (the EP experts sharded over the ranks
that hold the same experts). The reference is one process summing the same per-rank losses.
glm53-tiny has 8 routed experts, top-2.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.helpers import assert_close, assert_grads_close, spawn, tiny_model

B, T = 1, 203
LAYOUTS = {"ep2": dict(ep=2, cp=1), "ep4": dict(ep=4, cp=1), "ep2xcp2": dict(ep=2, cp=2)}


def _memory(recompute: str = "none"):
    from genome_lm.config import MemoryConfig

    return MemoryConfig(recompute=recompute, dsa_block_queries=16, moe_block_tokens=64, loss_chunk_tokens=48)


def _batch(seed: int):
    return torch.randint(0, 5, (B, T), generator=torch.Generator().manual_seed(seed))


def _reference(batches: list[torch.Tensor]) -> dict:
    from genome_lm.train.parallelize import parallelize

    model = parallelize(tiny_model(), _memory())
    losses = [model(ids, labels=ids).loss for ids in batches]
    sum(losses).backward()
    return {"losses": torch.stack(losses).detach(),
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}}


def _ep_worker(rank: int, world: int, out_dir: str) -> None:
    from torch.distributed.tensor import DTensor

    from genome_lm.config import ParallelConfig
    from genome_lm.parallel.mesh import init_parallel
    from genome_lm.train.parallelize import parallelize

    for name, layout in LAYOUTS.items():
        par = init_parallel(ParallelConfig(cp=layout["cp"], ep=layout["ep"]))
        model = parallelize(tiny_model(), _memory("per-layer" if name == "ep4" else "none"), par)
        ids = _batch(par.dp_rank)
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                 for n, p in model.named_parameters() if p.grad is not None}
        losses = [torch.zeros(()) for _ in range(world)]
        dist.all_gather(losses, loss.detach())
        if rank == 0:
            torch.save({"losses": torch.stack(losses[::layout["cp"]]), "grads": grads,
                        "repr": repr(model.model.layers[1].mlp)}, f"{out_dir}/{name}.pt")
        dist.barrier()


def test_expert_parallel_equals_one_process(tmp_path):
    spawn(_ep_worker, 4, str(tmp_path))
    for name, layout in LAYOUTS.items():
        got = torch.load(tmp_path / f"{name}.pt")
        ref = _reference([_batch(r) for r in range(4 // layout["cp"])])
        assert f"ep=rank 0 of {layout['ep']}" in got["repr"]
        assert_close(f"{name} losses", got["losses"], ref["losses"], 1e-5)
        assert_grads_close(name, got["grads"], ref["grads"], 1e-5)
