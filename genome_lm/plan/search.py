"""`--fit`: the fastest estimated layout that fits the GPU and host memory limits.

Searched: cp (powers of two dividing the GPUs; dp = GPUs / cp), ep (`ep_choices` unless given),
`STRATEGIES`, layer-input offload and MoE block recompute; the other keys are the given layout's.
Block sizes start at their largest and the block of the op at the peak is halved until the layout
fits: they do not change the first-order step time, so the largest blocks that fit are kept. The
highest estimated tokens/s wins; ties go to less host memory, then to the lower peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from genome_lm.plan.assumptions import Assumptions
from genome_lm.plan.hardware import Cluster, GiB
from genome_lm.plan.layout import Layout
from genome_lm.plan.planner import Plan, make_plan
from genome_lm.plan.shapes import ModelShape

STRATEGIES = (("none", ()), ("selective", ("moe",)), ("selective", ("dsa", "moe")), ("per-layer", ()))
BLOCKS = {  # field: (largest, smallest)
    "dsa_block_queries": (4096, 128),
    "moe_block_tokens": (65536, 1024),
    "loss_chunk_tokens": (16384, 1024),
}
PEAK_OP_BLOCK = (("dsa", "dsa_block_queries"), ("moe", "moe_block_tokens"), ("loss", "loss_chunk_tokens"))


@dataclass
class FitResult:
    given: Plan
    best: Plan | None
    tried: int
    faster_rejected: list[Plan] = field(default_factory=list)
    closest: Plan | None = None  # lowest peak among all, when nothing fits

    def explain(self) -> list[str]:
        g = self.given
        lines = [f"given layout: {g.layout.describe()}: "
                 + ("fits" if g.fits else "does not fit: " + "; ".join(g.problems))
                 + (f", {g.tokens_per_s:,.0f} tokens/s" if g.fits else "")]
        if self.best is None:
            c = self.closest
            assert c is not None  # set when nothing fits
            lines.append(f"nothing fits among {self.tried} layouts; "
                         f"the lowest peak is {c.peak_gpu_bytes / GiB:,.1f} GiB "
                         f"({c.layout.describe()}): " + "; ".join(c.problems)
                         + ". Use more GPUs, GPUs with more memory, or a shorter sequence.")
            return lines
        b = self.best
        lines += [f"chosen ({self.tried} layouts tried): {b.layout.describe()}: peak {b.peak_gpu_bytes / GiB:,.1f} "
                  f"GiB, host {b.host_bytes_per_gpu / GiB:,.0f} GiB/GPU, step {b.step_time_s:,.1f} s, "
                  f"{b.tokens_per_s:,.0f} tokens/s",
                  "  why: the highest estimated tokens/s among layouts within the limits; block sizes are the "
                  "largest that fit (they do not change the first-order time)"]
        return lines + [f"  faster, closest to fitting: {p.layout.describe()} ({p.tokens_per_s:,.0f} tokens/s): "
                        + "; ".join(p.problems) for p in self.faster_rejected[:3]]


def ep_choices(model: ModelShape, cluster: Cluster) -> tuple[int, ...]:
    """Expert-parallel degrees worth trying: powers of two up to a node dividing the GPUs and the experts."""
    top = min(cluster.gpus, cluster.gpus_per_node) if model.experts else 1
    return tuple(ep for ep in (2**i for i in range(top.bit_length())) if cluster.gpus % ep == 0
                 and (not model.experts or model.experts % ep == 0))


def fit(model: ModelShape, given: Layout, cluster: Cluster, assume: Assumptions,
        eps: tuple[int, ...] | None = None) -> FitResult:
    """The search of `genome-lm plan --fit` and benchmarks/plan_table.py. `eps`: the expert-parallel
    degrees to try (default `ep_choices`)."""
    given_plan = make_plan(model, given, cluster, assume)
    plans: list[Plan] = []
    largest = {k: v[0] for k, v in BLOCKS.items()}
    cps = [cp for cp in (2**i for i in range(cluster.gpus.bit_length()))
           if cluster.gpus % cp == 0 and given.seq_len % cp == 0]
    grid = product(cps, eps or ep_choices(model, cluster), STRATEGIES, (False, True), (False, True))
    for cp, ep, (recompute, layers), offload, moe_recompute in grid:
        if recompute == "none" and offload:
            continue
        layout = given.replace(cp=cp, dp=cluster.gpus // cp, ep=ep, recompute=recompute, recompute_layers=list(layers),
                               offload_layer_inputs=offload, moe_recompute=moe_recompute, **largest)
        plan = make_plan(model, layout, cluster, assume)
        while not plan.fits:  # halve the block of the op at the peak until the plan fits or no block can shrink
            key = next((k for op, k in PEAK_OP_BLOCK if op in plan.memory.peak_where.split(":")[-1]), None)
            if key is None or getattr(layout.memory, key) // 2 < BLOCKS[key][1]:
                break
            layout = layout.replace(**{key: getattr(layout.memory, key) // 2})
            plan = make_plan(model, layout, cluster, assume)
        plans.append(plan)
    fitting = [p for p in plans if p.fits]
    if not fitting:
        closest = min(plans + [given_plan], key=lambda p: p.peak_gpu_bytes)
        return FitResult(given_plan, None, len(plans), closest=closest)
    best = min(fitting, key=lambda p: (-round(p.tokens_per_s or 0), p.host_bytes_per_gpu, p.peak_gpu_bytes))
    # faster layouts that did not fit, closest to fitting first (what it would take to go faster)
    faster = sorted((p for p in plans if not p.fits and (p.tokens_per_s or 0) > (best.tokens_per_s or 0)),
                    key=lambda p: p.peak_gpu_bytes)
    return FitResult(given_plan, best, len(plans), faster_rejected=faster)

