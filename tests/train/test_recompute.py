"""Recompute and layer-input offload keep only what they should."""

import gc
import weakref

import torch
from torch import nn

from genome_lm.train.parallelize import recompute


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, scale=None):
        return torch.tanh(self.lin(x)) * (scale if scale is not None else 1.0)


def _run(offload: bool):
    torch.manual_seed(0)
    block = recompute(Block(), offload=offload)
    x = torch.randn(4, 8, requires_grad=True)
    h = x * 2  # the module's input: a non-leaf activation the caller drops after the forward
    ref = weakref.ref(h)
    y = block(h, scale=torch.tensor(0.5))
    del h
    gc.collect()
    alive = ref() is not None
    y.sum().backward()
    return alive, x.grad.clone(), block.lin.weight.grad.clone()


def test_offload_releases_the_device_input_and_gives_the_same_gradients():
    kept_alive, gx, gw = _run(offload=False)
    released, ox, ow = _run(offload=True)
    assert kept_alive, "without offload the input is saved for backward"
    assert not released, "with offload only the host copy may keep the input"
    torch.testing.assert_close(gx, ox)
    torch.testing.assert_close(gw, ow)


class Recorder(Block):
    """A Block that records, at each replay in backward, which parked inputs are back already."""

    seen: list = []

    def forward(self, x, scale=None):
        if torch.is_grad_enabled():  # the replay (the first forward runs under no_grad)
            from genome_lm.train import parallelize as memory

            Recorder.seen.append([p[0].on_device is not None for p in (r() for r in memory._PARKED) if p])
        return super().forward(x, scale)


def test_offload_prefetches_one_layer_ahead_and_counts_host_bytes():
    """Each offloaded layer's backward starts the copy back of the layer before it (in forward
    order), and only that one; host bytes rise by each parked input and fall back to zero."""
    from genome_lm.train.parallelize import host_bytes

    torch.manual_seed(0)
    blocks = [recompute(Recorder(), offload=True) for _ in range(3)]
    plain = [Block() for _ in range(3)]
    for b, p in zip(blocks, plain):
        p.load_state_dict(b.state_dict())
    x = torch.randn(4, 8, requires_grad=True)
    host_bytes(reset_peak=True)
    h = x
    for b in blocks:
        h = b(h)
    assert host_bytes() == (3 * x.nbytes, 3 * x.nbytes)
    Recorder.seen = []
    h.sum().backward()
    # replays in backward order 2, 1, 0; at each, the layers still parked are 0..i-1: only i-1 is back
    assert Recorder.seen == [[False, True], [True], []]
    assert host_bytes() == (0, 3 * x.nbytes)
    ref = x.detach().clone().requires_grad_(True)
    h = ref
    for p in plain:
        h = p(h)
    h.sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)
