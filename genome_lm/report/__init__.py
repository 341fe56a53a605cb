"""Plots, tables and the HTML report built from eval, compare and training-run outputs (docs/report.md).
The names below are imported on first use."""

from genome_lm.errors import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "data": "CompareResult EvalResult RunMetrics implied_compares load_compare_dir load_dirs load_eval load_run",
    "html": "build_report write_report",
    "matched": "ContextGain context_gain find_roles format_ablation format_context_gain reading",
    "plots": "figure_png plot_context_gain plot_loss_by_context plot_relative_change plot_repeat_split "
             "plot_training_curves",
    "tables": "bucket_table compare_table context_gain_table parity_table repeat_table replicates_table run_table",
})
