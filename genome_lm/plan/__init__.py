"""Memory and throughput model: will a run fit, and how fast will it go (`genome-lm plan`, docs/plan.md).

    from genome_lm.plan import Layout, make_cluster, make_plan, model_shape
    plan = make_plan(model_shape("glm53-flash"), Layout(seq_len=2**20).replace(cp=8, dp=8, recompute="per-layer",
                     offload_layer_inputs=True), make_cluster("b200", 64))
    plan.peak_gpu_bytes, plan.host_bytes_per_gpu, plan.step_time_s, plan.fits

The names below are imported on first use, so that `command` (what `genome-lm plan --help` reads)
loads no torch.
"""

from importlib import import_module
from typing import Any

_HOME = {"Assumptions": "hardware", "GPUS": "hardware", "make_cluster": "hardware", "Layout": "layout",
         "layout_from_config": "layout", "Plan": "planner", "make_plan": "planner", "fit": "planner",
         "model_shape": "shapes"}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
