"""TF32 tensor cores for float32 matmuls on CUDA (train.tf32, eval --no-tf32)."""

from __future__ import annotations

import torch


def set_tf32(enabled: bool) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA (precision 'high'), or full float32 ('highest')."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
