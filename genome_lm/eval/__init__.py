"""Held-out per-token loss by preceding context: scoring, buckets, statistics, comparison.

    summary = evaluate(EvalConfig(checkpoint=..., shards=..., out="evals/base"))
    result = write_compare("evals/base", "evals/longctx", out="evals/base_vs_longctx")

An eval directory holds `tokens.parquet` (per-token NLL, see `outputs.py`) and `summary.json`
(`{"overall": {"mean_nll", "n_tokens", ...}, "buckets": [{"lo", "hi", "n_tokens", "mean_nll",
"ci_low", "ci_high", ...}], "repeat": {...}, ...}`; with `--leakage-k` shards, `--annotate`,
`--strands both` and `--context` also "leakage", "annotations", "strands", "context_ablation", see
docs/architecture.md, On-disk formats); a compare directory holds `compare.json`.
Reading results (compare, report) does not import torch; `evaluate` does, on first use.
"""

from genome_lm.eval.buckets import assign, bucket_edges, contexts_of, log2_edges
from genome_lm.eval.compare import compare_evals, format_table, load_compare, write_compare
from genome_lm.eval.config import EvalConfig
from genome_lm.eval.outputs import iter_windows, load_summary, read_meta
from genome_lm.eval.text import format_summary

__all__ = [
    "EvalConfig", "evaluate", "load_summary", "compare_evals", "write_compare", "load_compare", "format_table",
    "format_summary",
    "iter_windows", "read_meta", "assign", "bucket_edges", "contexts_of", "log2_edges",
]


def __getattr__(name: str):
    if name == "evaluate":
        from genome_lm.eval.run import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
