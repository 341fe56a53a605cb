"""The parallel layout and memory strategy of a run: what the planner evaluates and `--fit` varies.

A `Layout` holds the experiment's own `memory`, `parallel` and `train` sections with dp resolved,
plus the sequence length, so a plan describes exactly what `genome-lm train` would run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pydantic import BaseModel

from genome_lm.config import MemoryConfig, ParallelConfig, TrainConfig
from genome_lm.errors import GenomeLMError
from genome_lm.options import validate
from genome_lm.settings import DEFAULTS
from genome_lm.sizes import format_size

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
SECTIONS: dict[str, type[BaseModel]] = {"memory": MemoryConfig, "parallel": ParallelConfig, "train": TrainConfig}


@dataclass(frozen=True)
class Layout:
    seq_len: int  # tokens per sequence (one sequence per CP group per micro-batch)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    parallel: ParallelConfig = field(default_factory=lambda: ParallelConfig(dp=1))  # dp: a number
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=1))
    kda_chunk: int = DEFAULTS.kda_chunk_size
    hc_recompute: bool = "hc" in DEFAULTS.ops  # hyper-connections recomputed (ops/hc), as apply_long_context does

    @property
    def dp(self) -> int:
        assert isinstance(self.parallel.dp, int), "a Layout's dp is resolved"
        return self.parallel.dp

    @property
    def gpus(self) -> int:
        return self.parallel.cp * self.dp

    @property
    def tokens(self) -> int:
        """Tokens one rank holds per micro-batch: micro_batch x seq_len / cp."""
        return self.train.micro_batch * -(-self.seq_len // self.parallel.cp)

    @property
    def reduce_bytes(self) -> int:
        """Bytes per element of FSDP2's gradient reduce-scatter (parallel.reduce_dtype)."""
        return DTYPE_BYTES[self.parallel.reduce_dtype]

    @property
    def state_bytes(self) -> int:
        """Bytes per element of each AdamW moment (train.optimizer_state_dtype)."""
        return DTYPE_BYTES[self.train.optimizer_state_dtype]

    def wraps(self, part: str) -> bool:
        """Whether recompute wraps `part` ('layer', 'kda', 'dsa', 'moe', 'dense')."""
        if self.memory.recompute == "per-layer":
            return part == "layer"
        return self.memory.recompute == "selective" and part in self.memory.recompute_layers

    def replace(self, **keys) -> Layout:
        """A copy with `keys` changed: seq_len, kda_chunk, hc_recompute, or keys of the memory, parallel
        and train sections by their config names, validated by their models."""
        own = {k: keys.pop(k) for k in [k for k in keys if k in {f.name for f in dataclasses.fields(self)}]}
        for name, model in SECTIONS.items():
            update = {k: keys.pop(k) for k in [k for k in keys if k in model.model_fields]}
            if update:
                own[name] = validate(model, {**getattr(self, name).model_dump(), **update}, name)
        if keys:
            raise TypeError(f"Layout.replace: unknown keys {sorted(keys)}")
        return dataclasses.replace(self, **own)

    def check(self) -> None:
        """The planner's own limits (the sections' keys are checked by their config models)."""
        cp, ep = self.parallel.cp, self.parallel.ep  # seq_len >= 1: a Size
        if self.seq_len < cp:
            raise GenomeLMError(f"parallel.cp={cp} is larger than the sequence ({self.seq_len} tokens)")
        if ep > 1 and self.gpus % ep:
            raise GenomeLMError(f"ep={ep} must divide the {self.gpus} GPUs of the dp x cp mesh")

    def to_json(self) -> dict:
        par, train = self.parallel, self.train
        return {"seq_len": self.seq_len, "tokens_per_rank": self.tokens, "memory": self.memory.model_dump(),
                "parallel": par.model_dump(include={"cp", "dp", "ep", "reduce_dtype", "backward_prefetch"}),
                "train": train.model_dump(include={"micro_batch", "grad_accum", "optimizer_state_dtype"}),
                "kda_chunk": self.kda_chunk, "hc_recompute": self.hc_recompute}

    def describe(self) -> str:
        mem, par = self.memory, self.parallel
        rec = mem.recompute + (f"[{','.join(mem.recompute_layers)}]" if mem.recompute == "selective" else "")
        parts = [f"cp={par.cp}", f"dp={self.dp}"] + ([f"ep={par.ep}"] if par.ep > 1 else [])
        parts += ["reduce=bf16"] if self.reduce_bytes == 2 else []
        parts += [f"bwd_prefetch={par.backward_prefetch}"] if par.backward_prefetch != 1 else []
        parts += ["adam_states=bf16"] if self.state_bytes == 2 else []
        parts += [f"recompute={rec}", f"offload={'on' if mem.offload_layer_inputs else 'off'}",
                  f"moe_recompute={'on' if mem.moe_recompute else 'off'}",
                  f"moe_block={format_size(mem.moe_block_tokens)}", f"dsa_block={format_size(mem.dsa_block_queries)}",
                  f"loss_chunk={format_size(mem.loss_chunk_tokens)}"]
        parts += [f"kda_heads_per_call={mem.kda_head_block}"] if mem.kda_head_block else []
        return " ".join(parts)
