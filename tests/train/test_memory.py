"""Recompute and layer-input offload keep only what they should."""

import gc
import weakref

import torch
from torch import nn

from genome_lm.train.memory import recompute


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
