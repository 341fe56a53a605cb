"""Held-out per-token loss by preceding context: scoring, buckets, statistics, comparison.

    summary = evaluate(EvalConfig(checkpoint=..., shards=..., out="evals/base"))
    result = write_compare("evals/base", "evals/longctx", out="evals/base_vs_longctx")

Output files: docs/architecture.md, On-disk formats. The names below are imported on first use, so
reading results (compare, report) imports no torch and `config.EvalConfig` (read by `--help`) no pyarrow.
"""

from importlib import import_module
from typing import Any

_HOME = {"compare_evals": "compare", "format_table": "text", "load_compare": "compare", "write_compare": "compare",
         "EvalConfig": "config", "evaluate": "run", "format_summary": "text", "iter_windows": "outputs",
         "load_summary": "outputs"}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
