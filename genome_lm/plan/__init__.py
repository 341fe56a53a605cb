"""Memory and throughput model: will a run fit, and how fast will it go (`genome-lm plan`).

    from genome_lm.plan import Layout, make_cluster, make_plan, model_shape
    plan = make_plan(model_shape("glm53-flash"), Layout(seq_len=2**20).replace(cp=8, dp=8, recompute="per-layer",
                     offload_layer_inputs=True), make_cluster("b200", 64))
    plan.peak_gpu_bytes, plan.host_bytes_per_gpu, plan.step_time_s, plan.fits

Modules, in the order they build on each other: hardware (GPU specs), assumptions (every
non-counted number), shapes (the model on the meta device), layout (parallelism + memory
strategy), activations (what autograd keeps), ops (per-op transients), memory (the step walked
phase by phase), throughput (time), planner (one plan), search (--fit), report, command (CLI).
See docs/plan.md for the model, its calibration and its comparison with the reference run.
"""

from genome_lm.plan.assumptions import Assumptions
from genome_lm.plan.hardware import GPUS, make_cluster
from genome_lm.plan.layout import Layout, layout_from_config
from genome_lm.plan.planner import Plan, make_plan
from genome_lm.plan.search import fit
from genome_lm.plan.shapes import model_shape

__all__ = ["Assumptions", "GPUS", "Layout", "Plan", "fit", "layout_from_config", "make_cluster", "make_plan",
           "model_shape"]
