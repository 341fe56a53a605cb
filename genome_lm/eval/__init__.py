"""Held-out per-token loss by preceding context: scoring, buckets, statistics, comparison.

    summary = evaluate(EvalConfig(checkpoint=..., shards=..., out="evals/base"))
    result = write_compare("evals/base", "evals/longctx", out="evals/base_vs_longctx")

Output files: docs/architecture.md, On-disk formats. The names below are imported on first use, so
reading results (compare, report) imports no torch and `config.EvalConfig` (read by `--help`) no pyarrow.
"""

from genome_lm.errors import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "compare": "compare_evals load_compare write_compare", "config": "EvalConfig", "run": "evaluate",
    "text": "format_table format_summary", "outputs": "iter_windows load_summary"})
