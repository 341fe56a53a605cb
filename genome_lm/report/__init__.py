"""Plots, tables and the HTML report built from eval, compare and training-run outputs.

    from genome_lm import report
    evals = [report.load_eval("evals/base"), report.load_eval("evals/longctx")]
    fig = report.plot_loss_by_context(evals)        # matplotlib Figure
    png = report.figure_png(fig)                     # bytes (Agg)
    report.write_report(["evals/base", "evals/longctx"], out="reports/demo.html", runs=["runs/demo_base"])
    gain = report.context_gain("evals/base", "evals/shortctx", "evals/longctx")   # context vs more training
    print(report.format_context_gain(gain))
"""

from genome_lm.report.data import (
    CompareResult,
    EvalResult,
    RunMetrics,
    implied_compares,
    load_compare_dir,
    load_dirs,
    load_eval,
    load_run,
)
from genome_lm.report.html import build_report, write_report
from genome_lm.report.matched import (
    ContextGain,
    context_gain,
    find_roles,
    format_ablation,
    format_context_gain,
    reading,
)
from genome_lm.report.plots import (
    figure_png,
    plot_context_gain,
    plot_loss_by_context,
    plot_relative_change,
    plot_repeat_split,
    plot_training_curves,
)
from genome_lm.report.tables import (
    bucket_table,
    compare_table,
    context_gain_table,
    parity_table,
    repeat_table,
    replicates_table,
    run_table,
)

__all__ = [
    "EvalResult", "CompareResult", "RunMetrics", "load_eval", "load_compare_dir", "load_dirs", "load_run",
    "implied_compares", "build_report", "write_report", "figure_png", "plot_loss_by_context",
    "plot_relative_change", "plot_repeat_split", "plot_training_curves", "bucket_table", "compare_table",
    "parity_table", "repeat_table", "replicates_table", "run_table", "ContextGain", "context_gain", "find_roles",
    "format_ablation",
    "format_context_gain",
    "reading", "plot_context_gain", "context_gain_table",
]
