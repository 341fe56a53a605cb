"""Settings shared by layers that do not import each other (no torch here).

`LongContextSettings`: what the long-context classes run with (`model.patch.apply_long_context`);
its defaults are the ones training uses, and `config.BlockSizes` / `MemoryConfig` and eval's
config take theirs from it, so each default lives here once. `STREAMING_CHUNK_TOKENS`: the
streaming engine's chunk (`model/streaming.py`, eval's `--chunk-tokens`).

`kda_backend` (`memory.kda_backend`, eval's `--kda-backend`) picks where KDA's kernels run, handed
to the op as an explicit argument (as fla's layers take `mode`): `auto` fla's Triton kernels for
CUDA tensors and genome_lm's torch ops for every other device, `fla` every tensor to fla (CPU
tensors under Triton's interpreter, the `make test-interpret` tier), `torch` never fla.
`GENOME_LM_KDA_BACKEND` (auto, fla or torch), read once when this module is imported, replaces
the default `auto` for the process and the processes it starts (docs/config.md, Environment).
"""

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
    """kda_chunk_size: chunk length of `chunk_kda`.
    kda_head_block: value heads per fla KDA kernel call (0: all; `chunk_kda`'s head_block).
    dsa_block_queries: queries per block of the DSA indexer and sparse attention.
    moe_block_tokens: tokens per MoE block.
    moe_recompute: rebuild each MoE block's activations in backward (see `model/ops/moe/chunk.py`).
    loss_chunk_tokens: tokens per chunk of the LM head + cross-entropy.
    kda_backend: where KDA's kernels run: "auto", "fla" or "torch" (module docstring).
    ops: which of "kda", "dsa", "moe", "hc", "norm", "mlp", "loss" to apply.
    """

    kda_chunk_size: int = 64
    kda_head_block: int = 0
    dsa_block_queries: int = 1024
    moe_block_tokens: int = 4096
    moe_recompute: bool = False
    loss_chunk_tokens: int = 4096
    kda_backend: KDABackend = "auto"
    ops: tuple[str, ...] = ALL_OPS

    def __post_init__(self):
        if unknown := set(self.ops) - set(ALL_OPS):
            raise ValueError(f"apply_long_context: unknown ops {sorted(unknown)}; choose from {ALL_OPS}")
        if self.kda_backend not in KDA_BACKENDS:
            raise ValueError(f"apply_long_context: kda_backend {self.kda_backend!r}; choose from {KDA_BACKENDS}")


def parse_kda_backend(raw: str) -> KDABackend:
    """The KDA backend `GENOME_LM_KDA_BACKEND=raw` asks for: auto (also when empty or unset), fla or torch."""
    value = raw.strip().lower() or "auto"
    if value not in KDA_BACKENDS:
        raise GenomeLMError(f"{KDA_BACKEND_ENV}={raw!r}: use one of {', '.join(KDA_BACKENDS)} (unset means auto)")
    return value  # type: ignore[return-value]


DEFAULTS = LongContextSettings(kda_backend=parse_kda_backend(os.environ.get(KDA_BACKEND_ENV, "")))  # read once
