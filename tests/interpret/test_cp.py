"""A 2-rank context-parallel step on gloo with every KDA call on fla (interpreted) vs one process in torch.

Rank r runs its slab's KDA core on fla's own context parallelism (`cp_kda_core`: one
`chunk_kda` per slab with a `cp_context`, the states exchanged inside fla's kernels, forward and
backward); loss, per-token NLL and every parameter gradient must equal the single-process run on
genome_lm's torch op, which the two-pass method (tests/parallel/test_cp.py) also equals.
glm53-demo (one KDA layer with 4 heads of 32, two DSA layers), T = 50: slabs of 25 tokens (fla's
forward interprets one program per token and head: short slabs).
"""

from tests.interpret import _interpreter  # noqa: F401, I001  (before anything imports triton)

import pytest
import torch
import torch.distributed as dist

from tests.helpers import assert_grads_close, spawn
from genome_lm.model.presets import preset_config

B, T = 1, 50
# the bounds of tests/parallel/test_cp.py; gradients: max |Δ| / max |ref| per parameter
RTOL = {"loss": 1e-5, "nll": 1e-4, "grad": 1e-4}


def _batch():
    ids = torch.randint(0, 5, (B, T), generator=torch.Generator().manual_seed(T))
    labels = ids.clone()
    labels[:, ::7] = -100
    return ids, labels


def _step(cp: bool, head_block: int = 0, backend: str = "fla") -> dict:
    """One forward + backward of glm53-demo (long-context ops, KDA on `backend`; CP over the world when `cp`)."""
    from genome_lm.model import build
    from genome_lm.model.patch import apply_long_context
    from genome_lm.parallel import apply_context_parallel

    torch.manual_seed(0)
    model = apply_long_context(build("glm53-demo").model, dsa_block_queries=16, moe_block_tokens=64,
                               loss_chunk_tokens=48, kda_head_block=head_block, kda_backend=backend)
    if cp:
        apply_context_parallel(model)
    ids, labels = _batch()
    out = model(ids, labels=labels, return_per_token_nll=True)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": out.loss.detach(), "nll": out.per_token_nll.detach(), "grads": grads}


def _cp_worker(rank: int, world: int, out_dir: str, head_block: int) -> None:
    import genome_lm.model.ops.kda as cp_mod
    from tests.interpret._interpreter import fla_cp_on_cpu

    fla_cp_on_cpu()
    real, calls = cp_mod.fla_chunk_kda(), []

    def counting(*args, **kwargs):
        calls.append((tuple(kwargs["v"].shape), kwargs["cp_context"] is not None))
        return real(*args, **kwargs)

    cp_mod.fla_chunk_kda = lambda *_: counting
    res = _step(cp=True, head_block=head_block)
    for g in res["grads"].values():  # CP ranks share parameters: their gradients add up
        dist.all_reduce(g)
    res["fla_calls"] = calls
    torch.save(res, f"{out_dir}/rank{rank}.pt")


@pytest.mark.parametrize("head_block", [0, 1], ids=["all-heads", "head-blocks"])
def test_cp_step_on_fla_matches_one_process(tmp_path, head_block):
    ref = _step(cp=False, backend="torch")
    spawn(_cp_worker, 2, str(tmp_path), head_block, timeout=280)
    config = preset_config("glm53-demo")
    H, K = config.linear_num_heads, config.linear_head_dim
    for rank, slab in enumerate([25, 25]):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        # one pass per slab (per head block), on fla's context parallelism (no state-map pass)
        want = [((B, slab, H, K), True)] if not head_block else [((B, slab, 1, K), True)] * H
        assert got["fla_calls"] == want, rank
        torch.testing.assert_close(got["loss"], ref["loss"], rtol=RTOL["loss"], atol=1e-6, msg="loss")
        torch.testing.assert_close(got["nll"], ref["nll"], rtol=RTOL["nll"], atol=1e-5, msg="per-token NLL")
        assert_grads_close(f"rank {rank}", got["grads"], ref["grads"], RTOL["grad"])
