"""`EvalConfig`: the settings of one `genome-lm eval` run (recorded in summary.json); the command's
flags, `--config FILE.yaml` and `--set` are generated from it (docs/config.md)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, field_validator

from genome_lm.config import BlockSizes
from genome_lm.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED
from genome_lm.settings import STREAMING_CHUNK_TOKENS
from genome_lm.sizes import Size

Sizes = Annotated[list[Size], BeforeValidator(lambda v: [p.strip() for p in v.split(",") if p.strip()]
                                              if isinstance(v, str) else v)]  # '1k,8k' (a flag) or a YAML list


class EvalConfig(BlockSizes):
    """The long-context block sizes and their defaults are training's (`config.BlockSizes`, the `memory:` section)."""

    checkpoint: str = Field(description="run checkpoint (RUN/checkpoints/last, step_N) or model directory "
                            "(with --dry-run also a preset, e.g. glm53-flash)")
    shards: str | None = Field(default=None, description="directory written by `genome-lm prepare` (required, "
                               "except that --dry-run can plan a window of --seq-len tokens without it)")
    out: str | None = Field(default=None, description="output directory: tokens.parquet, summary.json (required "
                            "except for a dry run)")
    split: str = "eval"
    seq_len: Size | None = Field(default=None, description="tokens per scored piece (default: the whole window); "
                                 "longer windows are scored in consecutive pieces whose context restarts")
    max_windows: int | None = Field(default=None, gt=0, description="score only N windows of the split (which: "
                                    "--window-pick)")
    window_pick: Literal["first", "spread"] = Field(
        default="first", description="with --max-windows N: 'first' scores the split's first N windows (shard order: "
        "along each chromosome); 'spread' scores N spaced evenly over the split, a sample of the whole of each "
        "chromosome rather than of its start")
    buckets: str = Field(default="log2", description="'log2' ([0,1), [1,2), [2,4), ...) or edges of context "
                         "buckets, e.g. 0,16,256,4k")
    engine: Literal["parallel", "streaming"] = "parallel"
    parity: bool = Field(default=False, description="also score with the other engine; report |delta log-prob|")
    chunk_tokens: Size = Field(default=STREAMING_CHUNK_TOKENS, description="tokens per chunk of the streaming engine")
    dtype: str | None = Field(default=None, description="float32 or bfloat16 (default: float32 on CPU, "
                              "bfloat16 on CUDA)")
    device: str | None = Field(default=None, description="cuda / cpu (default: cuda if available)")
    tf32: bool = Field(default=True, description="on CUDA, float32 matmuls on TF32 tensor cores (default); "
                       "--no-tf32: full float32")
    cp: int = Field(default=1, gt=0, description="context parallelism: split each window (piece) into C contiguous "
                    "slabs, one per process, for windows longer than one GPU holds; --nproc N must be a multiple "
                    "of C; the processes form N / C data-parallel replicas")
    annotate: list[str] = Field(default=[], json_schema_extra={"repeat": True, "metavar": "FILE.bed[:NAME]"},
                                description="split every table by a BED file's intervals (0-based, half-open; "
                                "chromosome names as prepare matches them): tokens in / out of them; NAME "
                                "defaults to the file name without its suffix; repeatable")
    strands: Literal["forward", "both"] = Field(default="forward", description="'both': also score the reverse "
                                                "complement of each window (summary.json strands: forward, reverse, "
                                                "average, per-base agreement)")
    context: Annotated[Sizes, AfterValidator(lambda v: sorted(set(v)))] = Field(
        default=[], json_schema_extra={"metavar": "L1,L2,..."},
        description="context ablation: score the last --ablation-targets tokens of each window given exactly L "
        "preceding tokens, for each L (comma-separated, e.g. 1k,2k,4k; each at most the window length minus the "
        "targets)")
    ablation_targets: Size | None = Field(default=None, json_schema_extra={"metavar": "N"},
                                          description="target tokens per window of --context (default: the last "
                                          "1/8 of each window)")
    resamples: int = Field(default=DEFAULT_RESAMPLES, gt=0, description="bootstrap replicates")
    seed: int = Field(default=DEFAULT_SEED, description="bootstrap seed")
    overwrite: bool = False

    @field_validator("dtype", "device", "buckets")
    @classmethod
    def _known(cls, v: str | None, info: ValidationInfo) -> str | None:
        if info.field_name == "dtype" and v is not None and v not in ("float32", "bfloat16"):
            raise ValueError(f"unknown dtype {v!r}; use float32 or bfloat16 "
                             "(default: float32 on CPU, bfloat16 on CUDA)")
        if info.field_name == "device" and v is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", v):
            raise ValueError(f"unknown device {v!r}; use cpu, cuda or cuda:N (default: cuda if available)")
        if info.field_name == "buckets" and not (v or "").strip():
            raise ValueError("is empty; use 'log2' or bucket edges such as 0,16,256,4k")
        return v


def resolve_dtype(dtype: str | None, device) -> str:
    """The dtype an eval runs in: `dtype`, else bfloat16 on CUDA and float32 elsewhere."""
    return dtype or ("bfloat16" if getattr(device, "type", str(device)).startswith("cuda") else "float32")
