"""`benchmarks/probe_context_reach.py`'s two patches: the banded attention is softmax over the last W
keys, and the KDA time scale at 1 is the model as it is (so its numbers measure the variant)."""

import pytest
import torch

from tests.helpers import assert_close, load_benchmark


@pytest.fixture(scope="module")
def probe():
    return load_benchmark("probe_context_reach")


def _nll(model, x):
    with torch.no_grad():
        return model(x, labels=x, return_per_token_nll=True).per_token_nll


@pytest.mark.parametrize("window", [1, 5, 17])
def test_banded_attention_is_softmax_over_the_last_window_keys(probe, window):
    import genome_lm.model.ops.dsa.chunk as dsa_chunk

    torch.manual_seed(0)
    B, T, H, R, scale = 2, 23, 3, 8, 0.3
    q, kv = torch.randn(B, T, H, R), torch.randn(B, T, R)
    with probe.banded_attention(window):
        got = dsa_chunk.dense_latent_attention(q, kv, scale)
    ref = torch.empty_like(q)
    for t in range(T):
        keys = kv[:, max(0, t - window + 1): t + 1]  # [B, n, R]
        w = torch.softmax(torch.einsum("bhr,bnr->bhn", q[:, t], keys) * scale, dim=-1)
        ref[:, t] = torch.einsum("bhn,bnr->bhr", w, keys)
    assert_close("banded attention", got, ref, 1e-5)


def test_patches_leave_the_model_unchanged_when_they_change_nothing(probe):
    from genome_lm.model import apply_long_context, build

    torch.manual_seed(0)
    model = apply_long_context(build("glm53-demo", dtype="float32")).eval()
    x = torch.randint(0, 4, (1, 96))
    ref = _nll(model, x)
    with probe.banded_attention(96):
        assert_close("window >= T", _nll(model, x), ref, 1e-5)
    with probe.banded_attention(4):
        assert (_nll(model, x) - ref).abs().max() > 1e-3  # the patch reaches the model's DSA layers
    with probe.kda_time_scale(1.0):
        assert_close("KDA time scale 1", _nll(model, x), ref, 1e-5)
    with probe.kda_time_scale(8.0):
        slowed = _nll(model, x)
    assert (slowed - ref).abs().max() > 1e-3  # the patch reaches the model
    assert_close("patch undone", _nll(model, x), ref, 0.0)
