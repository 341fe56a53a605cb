"""Settings shared by layers that do not import each other (no torch here).

`LongContextSettings`: what the long-context classes run with (`model.patch.apply_long_context`);
its defaults are the ones training uses, and `config.BlockSizes` / `MemoryConfig` and eval's
config take theirs from it, so each default lives here once. `STREAMING_CHUNK_TOKENS`: the
streaming engine's chunk (`model/streaming.py`, eval's `--chunk-tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass

ALL_OPS = ("kda", "dsa", "moe", "hc", "norm", "mlp", "loss")
STREAMING_CHUNK_TOKENS = 4096  # tokens per forward of the streaming engine


@dataclass(frozen=True)
class LongContextSettings:
    """kda_chunk_size: chunk length of `chunk_kda`.
    kda_head_block: value heads per fla KDA kernel call (0: all; `chunk_kda`'s head_block).
    dsa_block_queries: queries per block of the DSA indexer and sparse attention.
    moe_block_tokens: tokens per MoE block.
    moe_recompute: rebuild each MoE block's activations in backward (see `model/ops/moe/chunk.py`).
    loss_chunk_tokens: tokens per chunk of the LM head + cross-entropy.
    ops: which of "kda", "dsa", "moe", "hc", "norm", "mlp", "loss" to apply.
    """

    kda_chunk_size: int = 64
    kda_head_block: int = 0
    dsa_block_queries: int = 1024
    moe_block_tokens: int = 4096
    moe_recompute: bool = False
    loss_chunk_tokens: int = 4096
    ops: tuple[str, ...] = ALL_OPS

    def __post_init__(self):
        if unknown := set(self.ops) - set(ALL_OPS):
            raise ValueError(f"apply_long_context: unknown ops {sorted(unknown)}; choose from {ALL_OPS}")


DEFAULTS = LongContextSettings()
