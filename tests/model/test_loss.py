"""Chunked LM head + cross-entropy vs the plain reference (full logits + F.cross_entropy)."""

import pytest
import torch

from genome_lm.model.ops import loss as chunk_mod
from genome_lm.model.ops.loss import chunked_cross_entropy, naive_cross_entropy

pytestmark = pytest.mark.usefixtures("one_thread")

RTOL, ATOL = 1e-5, 1e-6  # fp32: loss, per-token NLL, grads of hidden and weight


def _inputs(n=37, d=16, v=11, ignored=(0, 5, 36), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, dtype=torch.float32).to(dtype).requires_grad_()
    weight = torch.randn(v, d, generator=g, dtype=torch.float32).to(dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    targets[list(ignored)] = -100
    return hidden, weight, targets


def _run(fn, hidden, weight, targets, upstream_grad, **kw):
    hidden.grad = weight.grad = None
    loss, nll = fn(hidden, weight, targets, return_per_token=True, **kw)
    (loss + (nll * upstream_grad).sum()).backward()  # exercises both outputs' gradients
    return loss.detach(), nll.detach(), hidden.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("chunk", [1, 8, 37, 100])
def test_chunked_matches_reference(chunk):
    hidden, weight, targets = _inputs()
    upstream_grad = torch.rand(hidden.shape[0], generator=torch.Generator().manual_seed(1))
    ref = _run(naive_cross_entropy, hidden, weight, targets, upstream_grad)
    got = _run(chunked_cross_entropy, hidden, weight, targets, upstream_grad, chunk_tokens=chunk)
    for name, r, c in zip(("loss", "nll", "d_hidden", "d_weight"), ref, got):
        torch.testing.assert_close(c, r, rtol=RTOL, atol=ATOL, msg=f"{name} (chunk {chunk})")
    assert got[1].dtype == torch.float32 and got[0].dtype == torch.float32
    assert torch.all(got[1][[0, 5, 36]] == 0)  # ignored targets: NLL 0
    assert torch.all(got[2][[0, 5, 36]] == 0)  # ... and no gradient


def test_mean_over_scored_tokens_only():
    hidden, weight, targets = _inputs()
    loss, nll = chunked_cross_entropy(hidden, weight, targets, chunk_tokens=8, return_per_token=True)
    scored = targets != -100
    torch.testing.assert_close(loss, nll[scored].mean())


def test_all_ignored_gives_zero_loss_and_grads():
    hidden, weight, targets = _inputs(ignored=range(37))
    loss = chunked_cross_entropy(hidden, weight, targets, chunk_tokens=8)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.all(hidden.grad == 0) and torch.all(weight.grad == 0)


def test_never_more_than_chunk_rows_of_logits(monkeypatch):
    seen = []
    original = chunk_mod._chunk_logits

    def spy(h, w):
        seen.append(h.shape[0])
        return original(h, w)

    monkeypatch.setattr(chunk_mod, "_chunk_logits", spy)
    hidden, weight, targets = _inputs(n=50)
    chunked_cross_entropy(hidden, weight, targets, chunk_tokens=16).backward()
    assert max(seen) <= 16 and sum(seen) == 2 * 50  # forward + recompute in backward


def test_bf16_inputs_float32_outputs():
    hidden, weight, targets = _inputs(dtype=torch.bfloat16)
    upstream_grad = torch.zeros(hidden.shape[0])
    ref = _run(naive_cross_entropy, hidden, weight, targets, upstream_grad)
    got = _run(chunked_cross_entropy, hidden, weight, targets, upstream_grad, chunk_tokens=8)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert got[2].dtype == torch.bfloat16 and got[3].dtype == torch.bfloat16
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-5)  # same bf16 logits, fp32 softmax
    torch.testing.assert_close(got[2].float(), ref[2].float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(got[3].float(), ref[3].float(), rtol=2e-2, atol=2e-3)


def test_weight_without_grad():
    hidden, weight, targets = _inputs()
    weight.requires_grad_(False)
    chunked_cross_entropy(hidden, weight, targets, chunk_tokens=8).backward()
    assert hidden.grad is not None and weight.grad is None
