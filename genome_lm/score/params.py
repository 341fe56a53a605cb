"""`ScoreParams` and `VariantsParams`: the settings of `genome-lm score` and `genome-lm variants`, from which
their flags, `--config FILE.yaml` and `--set` are generated. Light: pydantic only."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator

from genome_lm.config import BlockSizes
from genome_lm.errors import GenomeLMError
from genome_lm.eval.config import Sizes
from genome_lm.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED
from genome_lm.options import Params
from genome_lm.settings import DEFAULTS, STREAMING_CHUNK_TOKENS
from genome_lm.sizes import Size, parse_size

Layers = Annotated[list[int], BeforeValidator(lambda v: [p.strip() for p in v.split(",") if p.strip()]
                                              if isinstance(v, str) else v)]  # '0,5' (a flag) or a YAML list


def _pool(v):
    """'none', 'mean', or a stride of bases >= 1 ('128', 128, '1k')."""
    if v in ("none", "mean"):
        return v
    try:
        stride = parse_size(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else 0
    except GenomeLMError:
        stride = 0
    if stride < 1:
        raise ValueError(f"use none, mean or a stride in bases (a whole number >= 1, e.g. 128), not {v!r}")
    return stride


Pool = Annotated[Literal["none", "mean"] | int, BeforeValidator(_pool)]
STRANDS = {"forward": ["+"], "reverse": ["-"], "both": ["+", "-"]}


class ScoreParams(BlockSizes):
    """The long-context block sizes and their defaults are training's (`config.BlockSizes`)."""

    checkpoint: str = Field(description="run checkpoint (RUN/checkpoints/last, step_N) or model directory")
    fasta: str = Field(description="reference FASTA (.fa, .fa.gz, bgzip) holding the contigs to score")
    regions: str | None = Field(default=None, description="BED file of regions (0-based, half-open; chrom, start, "
                                "end[, name]); default: every contig of --fasta")
    out: str = Field(description="output directory: logp/ (Parquet), embeddings/, regions.parquet, summary.json")
    strands: Literal["forward", "reverse", "both"] = Field(
        default="forward", description="'reverse' scores the reverse complement (positions stay forward "
        "coordinates, strand '-'); 'both' scores each region twice")
    embeddings: Layers = Field(default=[], json_schema_extra={"metavar": "LAYERS"},
                               description="also write the residual stream after these decoder layers "
                               "(0-based, comma-separated), mean over the hyper-connection streams, float16")
    pool: Pool = Field(default="none", description="embeddings per base ('none'), one "
                                                 "mean per region ('mean'), or the mean of every STRIDE bases (a "
                                                 "number, e.g. 128)")
    chunk: Size = Field(default=STREAMING_CHUNK_TOKENS, description="tokens per streaming chunk, a multiple of 64 "
                        "(KDA states and DSA caches carried between chunks: the output does not depend on it)")
    dtype: Literal["float32", "bfloat16"] | None = Field(default=None, description="float32 or bfloat16 "
                                                         "(default: float32 on CPU, bfloat16 on CUDA)")
    device: str | None = Field(default=None, pattern=r"^(cpu|cuda(:\d+)?)$",
                               description="cuda / cpu / cuda:N (default: cuda if available)")
    cp: int = Field(default=1, gt=0, description="context parallelism with --nproc/--ray: each region is split "
                    "into C contiguous slabs, one per process")
    overwrite: bool = False

    @field_validator("chunk")
    @classmethod
    def _whole_kda_chunks(cls, v: int) -> int:
        if v % (k := DEFAULTS.kda_chunk_size):
            raise ValueError(f"{v} is not a multiple of {k} (the KDA chunk): chunks must end where the one-pass "
                             f"forward's KDA blocks do, for bfloat16 to equal it; use {max(k, v // k * k)}")
        return v

    def stride(self) -> int | None:
        """Bases per pooled embedding row: 1 for 'none', None for one row per region ('mean')."""
        return None if self.pool == "mean" else 1 if self.pool == "none" else int(self.pool)


class VariantsParams(Params):
    checkpoint: str = Field(description="a run's checkpoints/last, a checkpoint step_N or a model directory")
    fasta: str = Field(description="reference FASTA (.fa, .fa.gz, bgzip) of the VCF's assembly")
    vcf: str = Field(description="variants (.vcf or .vcf.gz; sorted, with its #CHROM header); multi-allelic "
                     "records are split")
    labels: str | None = Field(default=None, json_schema_extra={"metavar": "KEY"},
                               description="INFO key holding labels, e.g. CLNSIG (1: Pathogenic, Likely_pathogenic, "
                               "LOF, 1, true; 0: Benign, Likely_benign, FUNC, INT, 0, false; other values unlabelled)")
    labels_tsv: str | None = Field(default=None, json_schema_extra={"metavar": "TSV"},
                                   description="labels as chrom, pos, ref, alt, label lines (same values as --labels)")
    contexts: Sizes = Field(min_length=1, json_schema_extra={"metavar": "L1,L2,..."},
                            description="bases before the variant given to the model, e.g. 1k,8k,64k")
    after: int = Field(default=0, ge=0, json_schema_extra={"metavar": "N"},
                       description="also score the N bases after the variant (its downstream effect)")
    strands: Literal["forward", "both"] = Field(default="forward", description="'both': also score the reverse "
                                                "complement (the bases after the variant are then its context) and "
                                                "the mean of the two")
    out: str = Field(description="output directory (variants.parquet, summary.json)")
    chunk: Size = Field(default=STREAMING_CHUNK_TOKENS, gt=0, json_schema_extra={"metavar": "N"},
                        description="tokens per forward while the context is read")
    dtype: Literal["float32", "bfloat16"] | None = Field(default=None, description="default: float32 on CPU, "
                                                         "bfloat16 on CUDA")
    resamples: int = Field(default=DEFAULT_RESAMPLES, gt=0, description="bootstrap replicates")
    seed: int = Field(default=DEFAULT_SEED, description="bootstrap seed")
    overwrite: bool = False
