"""Whether a tensor holds values: fake tensors (`torch._subclasses.FakeTensor`, the rehearsal's
`genome_lm.train.rehearse`) have shapes, dtypes and devices but no data, so a check that reads
data (a padding mask that must be all True) cannot run on them. Such checks read
`has_values(t)` first and skip themselves on a fake tensor; the rehearsal's printout names what
it did not check."""

from __future__ import annotations

import torch


def has_values(t: torch.Tensor) -> bool:
    """False for a fake tensor (no data to read), True otherwise."""
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(t)
