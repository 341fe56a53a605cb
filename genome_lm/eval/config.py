"""`EvalConfig`: the settings of one `genome-lm eval` run (recorded in summary.json)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DTYPES = ("float32", "bfloat16")


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(description="training checkpoint (RUN/checkpoints/last, step_N) or model directory "
                            "(a preset name for --dry-run)")
    shards: str | None = Field(default=None, description="directory written by `genome-lm prepare` (required "
                               "except for a dry run)")
    out: str | None = Field(default=None, description="output directory (required except for a dry run)")
    split: str = "eval"
    seq_len: int | None = Field(default=None, gt=0, description="tokens per scored piece; None = whole window. "
                                "Longer windows are scored in consecutive pieces whose context restarts")
    max_windows: int | None = Field(default=None, gt=0, description="score only the first N windows of the split")
    buckets: str = Field(default="log2", description="'log2' or comma-separated edges of context buckets")
    engine: Literal["parallel", "streaming"] = "parallel"
    parity: bool = Field(default=False, description="also score with the other engine; report |delta log-prob|")
    chunk_tokens: int = Field(default=4096, gt=0, description="tokens per chunk of the streaming engine")
    loss_chunk_tokens: int = Field(default=2048, gt=0, description="tokens per chunk of the LM head + loss")
    dtype: str | None = Field(default=None, description="float32 or bfloat16; None: float32 on CPU, bfloat16 on CUDA")
    device: str | None = Field(default=None, description="cuda if available, else cpu")
    tf32: bool = Field(default=True, description="on CUDA, float32 matmuls on TF32 tensor cores; false: full float32")
    cp: int = Field(default=1, gt=0, description="context-parallel ranks per window (distributed eval): each "
                    "piece split into cp contiguous slabs; the processes form processes / cp data-parallel replicas")
    resamples: int = Field(default=2000, gt=0, description="bootstrap replicates")
    seed: int = Field(default=0, description="bootstrap seed")
    overwrite: bool = False

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str | None) -> str | None:
        if v is not None and v not in DTYPES:
            raise ValueError(f"unknown dtype {v!r}; use float32 or bfloat16 "
                             "(default: float32 on CPU, bfloat16 on CUDA)")
        return v


def resolve_dtype(dtype: str | None, device) -> str:
    """The dtype an eval runs in: `dtype`, else bfloat16 on CUDA and float32 elsewhere."""
    if dtype is not None:
        return dtype
    return "bfloat16" if getattr(device, "type", str(device)).startswith("cuda") else "float32"
