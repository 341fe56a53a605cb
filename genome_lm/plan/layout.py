"""The parallel layout and memory strategy of a run: what the planner evaluates and `--fit` varies.

`layout_from_config(cfg, gpus)` reads an experiment's `memory`, `parallel`, `train` and `data`
sections, so a plan describes exactly what `genome-lm train` would run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from genome_lm.errors import GenomeLMError
from genome_lm.sizes import format_size

RECOMPUTE = ("none", "per-layer", "selective")


def hc_recompute_available() -> bool:
    """Whether this checkout's `apply_long_context` recomputes hyper-connections (ops/hc)."""
    from genome_lm.model import patch

    return "hc" in getattr(patch, "ALL_OPS", ())


@dataclass(frozen=True)
class Layout:
    seq_len: int  # tokens per sequence (one sequence per CP group per micro-batch)
    cp: int = 1
    dp: int = 1
    ep: int = 1  # expert parallelism: routed experts split over ep ranks (parallel.ep)
    micro_batch: int = 1
    grad_accum: int = 1
    recompute: str = "none"
    recompute_layers: tuple[str, ...] = ()
    offload: bool = False
    offload_keep_last: int = 1  # the last layers whose inputs stay on the device (memory.offload_keep_last)
    moe_recompute: bool = False
    hc_recompute: bool = True
    moe_block_tokens: int = 4096
    dsa_block_queries: int = 1024
    loss_chunk_tokens: int = 4096
    kda_chunk: int = 64
    kda_head_block: int = 0  # KDA heads per fla call (memory.kda_head_block; 0: all)
    reduce_bytes: int = 4  # FSDP2 gradient reduce-scatter: 4 float32, 2 bfloat16 (parallel.reduce_dtype)
    backward_prefetch: int = 1  # layers all-gathered ahead in backward (parallel.backward_prefetch)
    state_bytes: int = 4  # each AdamW moment per parameter: 4 float32, 2 bfloat16 (train.optimizer_state_dtype)

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
        if self.seq_len < 1:
            raise GenomeLMError(f"--seq-len: must be positive, got {self.seq_len}")
        for name in ("cp", "dp", "ep", "micro_batch", "grad_accum", "moe_block_tokens", "dsa_block_queries",
                     "loss_chunk_tokens"):
            if getattr(self, name) < 1:
                raise GenomeLMError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.recompute not in RECOMPUTE:
            raise GenomeLMError(f"memory.recompute: {self.recompute!r}; use one of {', '.join(RECOMPUTE)}")
        if self.recompute == "selective" and not self.recompute_layers:
            raise GenomeLMError("memory.recompute: selective needs recompute_layers (kda, dsa, moe, dense)")
        if self.offload and self.recompute == "none":
            raise GenomeLMError("memory.offload_layer_inputs needs recompute per-layer or selective")
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
    if par.dp == "auto":
        total = gpus if gpus is not None else par.cp
        if total % par.cp:
            raise GenomeLMError(f"--gpus {total} is not a multiple of parallel.cp={par.cp}")
        dp = total // par.cp
    else:
        dp = par.dp
        if gpus is not None and dp * par.cp != gpus:
            raise GenomeLMError(f"parallel.cp={par.cp} x parallel.dp={dp} = {dp * par.cp} GPUs, but --gpus {gpus}; "
                                "set parallel.dp: auto or change --gpus")
    layout = Layout(
        seq_len=cfg.data.seq_len, cp=par.cp, dp=dp, ep=par.ep, micro_batch=cfg.train.micro_batch,
        reduce_bytes=2 if par.reduce_dtype == "bfloat16" else 4, backward_prefetch=par.backward_prefetch,
        state_bytes=2 if cfg.train.optimizer_state_dtype == "bfloat16" else 4,
        grad_accum=cfg.train.grad_accum, recompute=mem.recompute, recompute_layers=tuple(mem.recompute_layers),
        offload=mem.offload_layer_inputs, offload_keep_last=mem.offload_keep_last, moe_recompute=mem.moe_recompute,
        hc_recompute=hc_recompute_available(),
        moe_block_tokens=mem.moe_block_tokens, dsa_block_queries=mem.dsa_block_queries,
        loss_chunk_tokens=mem.loss_chunk_tokens, kda_head_block=mem.kda_head_block,
    )
    layout.check()
    return layout
