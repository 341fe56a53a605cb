"""`benchmarks/probe_context_reach.py`'s patches: the banded attention is softmax over the last W keys
(or the keys of the query's own W-block), the KDA time scale at 1 is the model as it is, and the KDA
and attention restarting at W make the second W tokens a fresh sequence (so their numbers measure
the variant); `probe_copy_learning.py --position-test` checks that last equality itself."""

import pytest
import torch

from tests.helpers import assert_close, load_benchmark


@pytest.fixture(scope="module")
def probe():
    return load_benchmark("probe_context_reach")


def _nll(model, x):
    with torch.no_grad():
        return model(x, labels=x, return_per_token_nll=True).per_token_nll


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("window", [1, 5, 17])
def test_banded_attention_is_softmax_over_the_last_window_keys(probe, window, restart):
    import genome_lm.model.ops.dsa.chunk as dsa_chunk

    torch.manual_seed(0)
    B, T, H, R, scale = 2, 23, 3, 8, 0.3
    q, kv = torch.randn(B, T, H, R), torch.randn(B, T, R)
    with probe.banded_attention(window, restart=restart):
        got = dsa_chunk.dense_latent_attention(q, kv, scale)
    ref = torch.empty_like(q)
    for t in range(T):
        first = t - t % window if restart else max(0, t - window + 1)
        keys = kv[:, first: t + 1]  # [B, n, R]
        w = torch.softmax(torch.einsum("bhr,bnr->bhn", q[:, t], keys) * scale, dim=-1)
        ref[:, t] = torch.einsum("bhn,bnr->bhr", w, keys)
    assert_close("banded attention", got, ref, 1e-5)


def test_patches_leave_the_model_unchanged_when_they_change_nothing(probe):
    from genome_lm.model import apply_long_context, build

    torch.manual_seed(0)
    model = apply_long_context(build("glm53-demo", dtype="float32").model).eval()
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


def test_restarting_kda_and_attention_at_w_makes_the_next_w_tokens_a_fresh_sequence(probe):
    from genome_lm.model import apply_long_context, build

    torch.manual_seed(0)
    model = apply_long_context(build("glm53-demo", dtype="float32").model).eval()
    W = 32
    x = torch.randint(0, 4, (2, 2 * W))
    fresh = _nll(model, x[:, W:])[:, 1:]  # token W itself is predicted from token W - 1
    with probe.kda_restart(W), probe.banded_attention(W, restart=True):
        assert_close("restart at W vs fresh", _nll(model, x)[:, W + 1:], fresh, 1e-5)
    for only in (probe.kda_restart(W), probe.banded_attention(W, restart=True)):
        with only:  # either alone still carries the first block forward
            assert (_nll(model, x)[:, W + 1:] - fresh).abs().max() > 1e-3
    with probe.kda_restart(W), pytest.raises(ValueError, match="whole number of blocks"):
        _nll(model, x[:, : W + 3])
