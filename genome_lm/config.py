"""Experiment configuration (docs/config.md): one pydantic model per section (data, model, train,
memory, log, parallel), loaded from YAML with `--set` overrides by `load_experiment`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from genome_lm.options import read_yaml, validate
from genome_lm.settings import DEFAULTS, KDABackend
from genome_lm.sizes import Size


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    shards: str = Field(description="directory written by `genome-lm prepare`")
    split: str = "train"
    seq_len: Size = Field(description="tokens per training sequence; longer windows are cut into consecutive pieces")
    min_piece: Size = Field(default=64, description="drop pieces (window tails) shorter than this")
    seed: int = Field(default=0, description="shuffling seed of the sequence order")
    reverse_complement: bool = Field(default=True, description="use the '-' strand rows if the shards have them")
    ignore_n: bool = Field(default=True, description="no loss on targets that are N")


class ModelConfig(Section):
    name: str = Field(description="preset (glm53-tiny, glm53-demo, glm53-mini, glm53-flash) or checkpoint directory")
    init: str | None = Field(default=None, description="checkpoint directory whose weights initialise the model; "
                             "${VAR} is read from the environment")
    dtype: Literal["float32", "bfloat16"] = "float32"
    overrides: dict[str, Any] = Field(default_factory=dict, description="Glm5NextTextConfig fields to override")


class TrainConfig(Section):
    steps: int = Field(gt=0)
    micro_batch: int = Field(default=1, gt=0)
    grad_accum: int = Field(default=1, gt=0)
    optimizer: Literal["adamw"] = "adamw"
    lr: float = Field(default=3e-4, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    weight_decay: float = Field(default=0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    optimizer_state_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="dtype of AdamW's moments; bfloat16 needs betas <= 0.992 (docs/precision.md)")
    grad_clip: float | None = Field(default=1.0, gt=0)
    seed: int = 0
    checkpoint_every: int = Field(default=100, gt=0)
    keep_checkpoints: int = Field(default=2, gt=0)
    export_model: bool | Literal["last"] = Field(
        default=True, description="which checkpoints get the Hugging Face-style model/: true every one, last only the "
        "final step's, false none (docs/train.md, Checkpoints)")
    on_nonfinite: Literal["stop", "skip"] = "stop"
    checkpoint_mode: Literal["async", "sync"] = Field(
        default="async", description="async: dcp.async_save; sync: training waits for the write (docs/long-runs.md)")
    on_disk_full: Literal["stop", "skip"] = Field(
        default="stop", description="a checkpoint that would not fit the free space: stop, or skip that save")
    preempt_signals: list[Literal["SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT"]] = Field(
        default=["SIGTERM", "SIGUSR1"], description="signals that checkpoint and stop the run with exit code 75 "
        "(docs/long-runs.md, Preemption); [] turns this off")
    tf32: bool = Field(default=True, description="on CUDA, float32 matmuls on TF32 tensor cores (docs/precision.md)")
    moe_bias_update_rate: float = Field(
        default=0.0, ge=0, description="DeepSeek-V3's auxiliary-loss-free expert balancing (docs/train.md); 0 keeps "
        "the routers' bias as loaded")


class BlockSizes(Section):
    """Block sizes and KDA backend of the long-context ops (training's `memory:`, eval's flags)."""

    moe_block_tokens: Size = Field(default=DEFAULTS.moe_block_tokens, description="tokens per block of the chunked MoE")
    dsa_block_queries: Size = Field(default=DEFAULTS.dsa_block_queries,
                                    description="queries per block of DSA sparse attention")
    loss_chunk_tokens: Size = Field(default=DEFAULTS.loss_chunk_tokens,
                                    description="tokens per chunk of the LM head + loss")
    kda_head_block: int = Field(default=DEFAULTS.kda_head_block, ge=0,
                                description="KDA heads per fla kernel call on CUDA (0: all): fla's backward "
                                "transients shrink by heads / kda_head_block (docs/plan.md)")
    kda_backend: KDABackend = Field(default=DEFAULTS.kda_backend,
                                    description="where KDA's kernels run: auto (fla's Triton kernels for CUDA tensors, "
                                    "genome_lm's torch ops elsewhere), fla (every tensor; CPU ones under Triton's "
                                    "interpreter) or torch (also on CUDA)")


class MemoryConfig(BlockSizes):
    recompute: Literal["none", "per-layer", "selective"] = "none"
    recompute_layers: list[Literal["kda", "dsa", "moe", "dense"]] = Field(
        default_factory=list, description="with recompute: selective, the layer kinds to recompute")
    offload_layer_inputs: bool = False
    offload_keep_last: int = Field(
        default=1, ge=0, description="with offload_layer_inputs: the last N decoder layers keep their checkpointed "
        "inputs on the device (the last layer's backward starts right after the loss, so its copy back could not "
        "overlap anything); 0 offloads every layer")
    moe_recompute: bool = Field(default=DEFAULTS.moe_recompute,
                                description="rebuild each MoE block's expert activations in backward")

    @model_validator(mode="after")
    def _selective_needs_layers(self):
        if self.recompute == "selective" and not self.recompute_layers:
            raise ValueError("recompute: selective needs recompute_layers (any of kda, dsa, moe, dense)")
        if self.offload_layer_inputs and self.recompute == "none":
            raise ValueError("offload_layer_inputs needs recompute per-layer or selective "
                             "(it offloads checkpointed inputs)")
        return self


class LogConfig(Section):
    wandb: Literal["offline", "online", "disabled"] = "offline"
    project: str = "genome_lm"
    every: int = Field(default=1, gt=0)


class ParallelConfig(Section):
    cp: int = Field(default=1, gt=0, description="context-parallel ranks per sequence")
    dp: int | Literal["auto"] = "auto"
    ep: int = Field(default=1, gt=0, description="expert-parallel ranks, a divisor of the world and the experts "
                    "(docs/parallel.md)")
    reduce_dtype: Literal["float32", "bfloat16"] = Field(default="float32", description="FSDP2's reduce-scatter dtype")
    backward_prefetch: int = Field(default=1, ge=0, description="layers FSDP2 all-gathers ahead in backward")
    timeout: float = Field(default=1800, gt=0, description="seconds a collective may wait (process-group timeout)")
    watchdog_factor: float = Field(default=10, ge=0, description="abort a rank whose step takes this many times "
                                   "the median step time (0: no watchdog; docs/long-runs.md)")
    watchdog_min_s: float = Field(default=300, gt=0, description="the watchdog never aborts a step sooner than this")


class ExperimentConfig(Section):
    name: str | None = None
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)


def parse_experiment(raw: dict, source: str = "config") -> ExperimentConfig:
    return validate(ExperimentConfig, raw, source)


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    path = Path(path)
    raw = read_yaml(path, "data, model, train, ... (the sections)",
                    "experiment file {} does not exist; see experiments/ for examples")
    cfg = validate(ExperimentConfig, raw, str(path), overrides=overrides)
    if cfg.name is None:
        cfg.name = path.stem
    return cfg
