"""TF32 tensor cores for float32 matmuls on CUDA: `set_tf32` (train.tf32, eval --no-tf32)."""

from __future__ import annotations

import torch


def set_tf32(enabled: bool) -> None:
    """TF32 tensor cores for float32 matmuls and convolutions on CUDA (torch's float32 matmul
    precision 'high'), or full float32 ('highest'). No effect on CPU arithmetic."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
