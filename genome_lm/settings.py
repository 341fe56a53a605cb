"""Settings shared by layers that do not import each other (torch only inside `set_tf32`):
`LongContextSettings`, what the long-context classes run with, whose defaults the config models take,
so each lives here once. `GENOME_LM_KDA_BACKEND`, read once at import, replaces the default KDA backend
`auto` for the process and those it starts (docs/config.md, Environment)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, get_args

from genome_lm.errors import GenomeLMError

ALL_OPS = ("kda", "dsa", "moe", "hc", "norm", "mlp", "loss")
KDABackend = Literal["auto", "fla", "torch"]
KDA_BACKENDS: tuple[str, ...] = get_args(KDABackend)
KDA_BACKEND_ENV = "GENOME_LM_KDA_BACKEND"
STREAMING_CHUNK_TOKENS = 4096  # tokens per forward of the streaming engine


@dataclass(frozen=True)
class LongContextSettings:
    """What the long-context classes run with (`model.patch.apply_long_context`)."""

    kda_chunk_size: int = 64  # chunk length of `chunk_kda`
    kda_head_block: int = 0  # value heads per fla KDA kernel call (0: all)
    dsa_block_queries: int = 1024  # queries per block of the DSA indexer and sparse attention
    moe_block_tokens: int = 4096
    moe_recompute: bool = False  # rebuild each MoE block's activations in backward
    loss_chunk_tokens: int = 4096  # tokens per chunk of the LM head + cross-entropy
    kda_backend: KDABackend = "auto"
    ops: tuple[str, ...] = ALL_OPS  # which ops to apply

    def __post_init__(self):
        if unknown := set(self.ops) - set(ALL_OPS):
            raise ValueError(f"apply_long_context: unknown ops {sorted(unknown)}; choose from {ALL_OPS}")


def parse_kda_backend(raw: str) -> KDABackend:
    """The KDA backend `GENOME_LM_KDA_BACKEND=raw` asks for (empty: auto)."""
    value = raw.strip().lower() or "auto"
    if value not in KDA_BACKENDS:
        raise GenomeLMError(f"{KDA_BACKEND_ENV}={raw!r}: use one of {', '.join(KDA_BACKENDS)} (unset means auto)")
    return value  # type: ignore[return-value]


DEFAULTS = LongContextSettings(kda_backend=parse_kda_backend(os.environ.get(KDA_BACKEND_ENV, "")))  # read once


def set_tf32(enabled: bool) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA (precision 'high'), or full float32 ('highest')."""
    import torch

    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
