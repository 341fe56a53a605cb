"""The whole patched model (`apply_long_context`, every op) vs unpatched upstream, and its memory.

Tolerances (fp32): loss and per-token NLL max |Δ| <= 1e-4, gradients max |Δ| <= 1e-4 · max(1,
max |reference|) per parameter (observed <= 1e-6 and <= 3e-7). At long T the KDA op's float
rounding (~1e-8 on the layer outputs) can flip a DSA top-k choice between two pools whose indexer
scores are that close; from then on that token attends to a different pool. `test_..._2048`
allows that for at most 5% of the tokens, by at most 0.05 (loss still within 1e-4).
"""

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from genome_lm.model import apply_long_context, use_torch_fallbacks
from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.hc import RecomputedHyperConnection
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.ops.mlp import LeanMLP
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.ops.norm import LeanRMSNorm
from genome_lm.model.upstream import glm
from tests.helpers import assert_close, largest_tensor, tiny_model

TOL = 1e-4


pytestmark = pytest.mark.usefixtures("one_thread")


def pair(seed: int, **overrides):
    ref = tiny_model(seed, **overrides)
    patched = apply_long_context(copy.deepcopy(ref), dsa_block_queries=100, moe_block_tokens=77,
                                 loss_chunk_tokens=50, kda_chunk_size=16, moe_recompute=True)
    return ref, patched


def loss_and_grads(model, x):
    model.zero_grad()
    out = model(x, labels=x, return_per_token_nll=True)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("T, seed, overrides", [
    (1, 0, {}),
    (7, 1, {}),
    (30, 2, {}),  # shorter than top-k (32), not a multiple of the pool size (4)
    (301, 3, {}),
    (301, 4, dict(linear_num_heads=4, linear_head_dim=16, index_topk=16)),
])
def test_patched_model_matches_upstream(T, seed, overrides):
    ref, patched = pair(seed, **overrides)
    for upstream, cls in [(glm.Glm5NextTextHyperConnection, RecomputedHyperConnection), (glm.Glm5NextTextMoE,
                          BlockedGlm5NextTextMoE), (glm.Glm5NextTextLinearAttention, LongKDA),
                          (glm.Glm5NextTextAttention, LongDSA), (glm.Glm5NextTextRMSNorm, LeanRMSNorm)]:
        assert all(type(m) is cls for m in patched.modules() if isinstance(m, upstream))
    dense = [layer.mlp for layer in patched.model.layers if isinstance(layer.mlp, glm.Glm5NextTextMLP)]
    assert dense and all(type(mlp) is LeanMLP for mlp in dense) and patched.loss_chunk_tokens == 50
    x = torch.randint(0, 16, (1, T), generator=torch.Generator().manual_seed(T))
    with use_torch_fallbacks():
        ref_out, ref_grads = loss_and_grads(ref, x)
    out, grads = loss_and_grads(patched, x)
    assert_close("loss", out.loss, ref_out.loss, TOL, floor=None)
    assert_close("per-token NLL", out.per_token_nll, ref_out.per_token_nll, TOL, floor=None)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        assert_close(name, grads[name], g, TOL)


def test_patched_model_matches_upstream_at_2048():
    T = 2048
    ref, patched = pair(2048)
    x = torch.randint(0, 16, (1, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with use_torch_fallbacks():
            ref_out = ref(x, labels=x, return_per_token_nll=True)
        out = patched(x, labels=x, return_per_token_nll=True)
    diff = (out.per_token_nll - ref_out.per_token_nll).abs()[0]
    assert abs(out.loss.item() - ref_out.loss.item()) <= TOL
    # observed with a flipped near-tie (another seed): 37 of 2,048 tokens above 1e-4, max 0.010
    assert (diff > TOL).float().mean().item() <= 0.05, f"{int((diff > TOL).sum())} tokens off"
    assert diff.max().item() <= 0.05


def test_patched_forward_backward_never_allocates_t_by_t():
    T = 3000
    model = apply_long_context(tiny_model(5))  # default block sizes
    x = torch.randint(0, 16, (1, T))
    with largest_tensor() as mode:
        model(x, labels=x).loss.backward()
    # largest: a DSA query block's indexer scores [1, 1024, HI, P = 750]; T*T = 9e6
    assert mode.largest < T * T // 4, mode.largest


@pytest.mark.slow
def test_patched_forward_backward_at_64k_fits():
    """fwd+bwd at T = 65,536 in a fresh process: peak RSS (VmHWM) stays well inside this machine."""
    script = textwrap.dedent("""
        import json, torch
        from genome_lm.model import apply_long_context, build
        from genome_lm.train.metrics import PeakMemory
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = apply_long_context(build("glm53-tiny").model)
        x = torch.randint(0, 16, (1, 65536))
        base = int(open("/proc/self/statm").read().split()[1]) * 4096
        peak = PeakMemory(torch.device("cpu"))
        peak.reset()
        loss = model(x, labels=x).loss
        loss.backward()
        grads_ok = all(torch.isfinite(p.grad).all().item() for p in model.parameters() if p.grad is not None)
        print(json.dumps({"peak": peak.peak(), "base": base, "loss": loss.item(), "grads_ok": grads_ok}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["grads_ok"] and 2.0 < r["loss"] < 3.5
    extra = r["peak"] - r["base"]
    assert extra < 8 * 2**30, f"peak {extra / 2**30:.1f} GiB over the built model"  # measured ~5.5 GiB
