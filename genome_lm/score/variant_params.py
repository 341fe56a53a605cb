"""`genome-lm variants` flags (light: pydantic only, imported for --help)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from genome_lm.eval.config import Sizes
from genome_lm.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED
from genome_lm.settings import STREAMING_CHUNK_TOKENS
from genome_lm.sizes import Size


class VariantsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

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
