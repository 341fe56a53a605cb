"""`EvalConfig`: the settings of one `genome-lm eval` run (recorded in summary.json)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(description="training checkpoint (RUN/checkpoints/last, step_N) or model directory")
    shards: str = Field(description="directory written by `genome-lm prepare`")
    out: str = Field(description="output directory")
    split: str = "eval"
    seq_len: int | None = Field(default=None, gt=0, description="tokens per scored piece; None = whole window. "
                                "Longer windows are scored in consecutive pieces whose context restarts")
    max_windows: int | None = Field(default=None, gt=0, description="score only the first N windows of the split")
    buckets: str = Field(default="log2", description="'log2' or comma-separated edges of context buckets")
    engine: Literal["parallel", "streaming"] = "parallel"
    parity: bool = Field(default=False, description="also score with the other engine; report |delta log-prob|")
    chunk_tokens: int = Field(default=4096, gt=0, description="tokens per chunk of the streaming engine")
    loss_chunk_tokens: int = Field(default=2048, gt=0, description="tokens per chunk of the LM head + loss")
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str | None = Field(default=None, description="cuda if available, else cpu")
    resamples: int = Field(default=2000, gt=0, description="bootstrap replicates")
    seed: int = Field(default=0, description="bootstrap seed")
    overwrite: bool = False
