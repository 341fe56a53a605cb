"""The parallel layout and memory strategy of a run: what the planner evaluates and `--fit` varies.

`layout_from_config(cfg, gpus)` reads an experiment's `memory`, `parallel`, `train` and `data`
sections, so a plan describes exactly what `genome-lm train` would run. A `Layout`'s defaults are
those of `config.MemoryConfig`, `config.ParallelConfig` and `config.TrainConfig` (block sizes from
`settings.LongContextSettings` through them), and `Layout.check` validates the memory and parallel
keys with those models; dp comes from `parallel.layout.resolve_layout`, as in a run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from genome_lm.config import MemoryConfig, ParallelConfig, TrainConfig
from genome_lm.errors import GenomeLMError
from genome_lm.options import validate
from genome_lm.parallel.layout import LayoutWords, resolve_layout
from genome_lm.settings import DEFAULTS
from genome_lm.sizes import format_size

MEMORY, PARALLEL = MemoryConfig(), ParallelConfig()  # the defaults a Layout starts from
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# Layout field -> MemoryConfig key
MEMORY_KEYS = {"recompute": "recompute", "recompute_layers": "recompute_layers", "offload": "offload_layer_inputs",
               "offload_keep_last": "offload_keep_last", "moe_recompute": "moe_recompute",
               "moe_block_tokens": "moe_block_tokens", "dsa_block_queries": "dsa_block_queries",
               "loss_chunk_tokens": "loss_chunk_tokens", "kda_head_block": "kda_head_block"}
PLAN_WORDS = LayoutWords(
    no_world="--gpus {world}: the number of GPUs must be >= 1",
    too_few="--gpus {world} is not a multiple of parallel.cp={cp}",
    not_divisor="--gpus {world} is not a multiple of parallel.cp={cp}",
    dp_mismatch="parallel.cp={cp} x parallel.dp={dp} = {need} GPUs, but --gpus {world}; set parallel.dp: auto or "
                "change --gpus",
)


@dataclass(frozen=True)
class Layout:
    seq_len: int  # tokens per sequence (one sequence per CP group per micro-batch)
    cp: int = PARALLEL.cp
    dp: int = 1
    ep: int = PARALLEL.ep  # expert parallelism: routed experts split over ep ranks (parallel.ep)
    micro_batch: int = TrainConfig.model_fields["micro_batch"].default
    grad_accum: int = TrainConfig.model_fields["grad_accum"].default
    recompute: str = MEMORY.recompute
    recompute_layers: tuple[str, ...] = tuple(MEMORY.recompute_layers)
    offload: bool = MEMORY.offload_layer_inputs
    offload_keep_last: int = MEMORY.offload_keep_last  # the last layers whose inputs stay on the device
    moe_recompute: bool = MEMORY.moe_recompute
    hc_recompute: bool = "hc" in DEFAULTS.ops  # hyper-connections recomputed (ops/hc), as apply_long_context does
    moe_block_tokens: int = MEMORY.moe_block_tokens
    dsa_block_queries: int = MEMORY.dsa_block_queries
    loss_chunk_tokens: int = MEMORY.loss_chunk_tokens
    kda_chunk: int = DEFAULTS.kda_chunk_size
    kda_head_block: int = MEMORY.kda_head_block  # KDA heads per fla call (0: all)
    reduce_bytes: int = DTYPE_BYTES[PARALLEL.reduce_dtype]  # FSDP2 gradient reduce-scatter (parallel.reduce_dtype)
    backward_prefetch: int = PARALLEL.backward_prefetch  # layers all-gathered ahead in backward
    state_bytes: int = DTYPE_BYTES[TrainConfig.model_fields["optimizer_state_dtype"].default]  # each AdamW moment

    @classmethod
    def from_memory(cls, seq_len: int, memory: MemoryConfig, **rest) -> "Layout":
        """A layout of `memory`'s strategy and block sizes (`rest`: cp, dp, micro_batch, ...)."""
        keys = {name: getattr(memory, key) for name, key in MEMORY_KEYS.items()}
        return cls(seq_len=seq_len, **{**keys, "recompute_layers": tuple(memory.recompute_layers)}, **rest)

    @property
    def gpus(self) -> int:
        return self.cp * self.dp

    @property
    def tokens(self) -> int:
        """Tokens one rank holds per micro-batch: micro_batch x seq_len / cp."""
        return self.micro_batch * -(-self.seq_len // self.cp)

    def wraps(self, part: str) -> bool:
        """Whether recompute wraps `part` ('layer', 'kda', 'dsa', 'moe', 'dense')."""
        if self.recompute == "per-layer":
            return part == "layer"
        if self.recompute == "selective":
            return part in self.recompute_layers
        return False

    def replace(self, **changes) -> "Layout":
        return dataclasses.replace(self, **changes)

    def check(self) -> None:
        """The planner's own limits; the memory and parallel keys are checked by their config models."""
        if self.seq_len < 1:
            raise GenomeLMError(f"--seq-len: must be positive, got {self.seq_len}")
        for name in ("dp", "micro_batch", "grad_accum"):
            if getattr(self, name) < 1:
                raise GenomeLMError(f"{name}: must be >= 1, got {getattr(self, name)}")
        validate(MemoryConfig, {key: getattr(self, name) for name, key in MEMORY_KEYS.items()}, "memory")
        validate(ParallelConfig, {"cp": self.cp, "ep": self.ep, "backward_prefetch": self.backward_prefetch},
                 "parallel")
        if self.seq_len < self.cp:
            raise GenomeLMError(f"parallel.cp={self.cp} is larger than the sequence ({self.seq_len} tokens)")
        if self.ep > 1 and (self.dp * self.cp) % self.ep:
            raise GenomeLMError(f"ep={self.ep} must divide the {self.dp * self.cp} GPUs of the dp x cp mesh")

    def describe(self) -> str:
        rec = self.recompute + (f"[{','.join(self.recompute_layers)}]" if self.recompute == "selective" else "")
        parts = [f"cp={self.cp}", f"dp={self.dp}"] + ([f"ep={self.ep}"] if self.ep > 1 else [])
        parts += [f"reduce={'bf16' if self.reduce_bytes == 2 else 'fp32'}"] if self.reduce_bytes != 4 else []
        parts += [f"bwd_prefetch={self.backward_prefetch}"] if self.backward_prefetch != 1 else []
        parts += ["adam_states=bf16"] if self.state_bytes == 2 else []
        parts += [f"recompute={rec}", f"offload={'on' if self.offload else 'off'}",
                  f"moe_recompute={'on' if self.moe_recompute else 'off'}",
                  f"moe_block={format_size(self.moe_block_tokens)}", f"dsa_block={format_size(self.dsa_block_queries)}",
                  f"loss_chunk={format_size(self.loss_chunk_tokens)}"]
        parts += [f"kda_heads_per_call={self.kda_head_block}"] if self.kda_head_block else []
        return " ".join(parts)


def layout_from_config(cfg, gpus: int | None = None) -> Layout:
    """The layout an ExperimentConfig describes; `dp: auto` becomes gpus / cp."""
    par, mem = cfg.parallel, cfg.memory
    world = gpus if gpus is not None else par.cp * (1 if par.dp == "auto" else par.dp)
    dp, cp = resolve_layout(par.cp, par.dp, world, PLAN_WORDS)
    layout = Layout.from_memory(
        cfg.data.seq_len, mem, cp=cp, dp=dp, ep=par.ep, micro_batch=cfg.train.micro_batch,
        grad_accum=cfg.train.grad_accum, reduce_bytes=DTYPE_BYTES[par.reduce_dtype],
        backward_prefetch=par.backward_prefetch, state_bytes=DTYPE_BYTES[cfg.train.optimizer_state_dtype],
    )
    layout.check()
    return layout
