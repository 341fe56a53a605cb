"""`make_plan(...)`: memory per GPU, host memory, step time, checkpoint cost and whether it all fits;
`fit(...)` (`--fit`): the fastest estimated layout that fits.

On a CPU (`cluster=None`) the plan predicts the trainer's `peak_mem_bytes` there: the process's peak
resident set = `process_baseline_bytes` (measured by the caller) + the step's gradients, activations
and transients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from genome_lm.plan.hardware import GB, Assumptions, Cluster, GiB
from genome_lm.plan.layout import Layout
from genome_lm.plan.memory import MASTER_BYTES, MemoryPlan, plan_memory, shard_degree
from genome_lm.plan.shapes import ModelShape
from genome_lm.plan.throughput import TimePlan, plan_time


@dataclass
class CheckpointPlan:
    asynchronous: bool
    train_state_bytes: int  # the whole train_state/ (all ranks)
    export_bytes: int  # model/ in the model's dtype
    state_bytes_per_gpu: int  # what each GPU writes (and, asynchronously, stages)
    staging_host_bytes_per_gpu: int  # pinned host memory of the staged copy (0 when sync)
    stall_s: float  # training waits this long per checkpoint
    write_s: float  # writing train_state/ at the assumed filesystem bandwidth


def plan_checkpoint(m: ModelShape, layout: Layout, assume: Assumptions, cluster: Cluster) -> CheckpointPlan:
    """What a training checkpoint costs (docs/plan.md, Checkpoints): train_state/ is (4 + 2 x the AdamW
    moment bytes) per parameter, each GPU writing its shard. Async: training stalls while each GPU copies
    its shard to pinned host memory, staged until the background write (at `checkpoint_write_gbps`)
    ends. Sync: training stalls for the whole write and stages nothing."""
    per_param = MASTER_BYTES + 2 * layout.state_bytes
    total = per_param * m.param_count
    per_gpu = total // shard_degree(layout, assume)
    write_s = total / (assume.checkpoint_write_gbps * GB)
    if assume.checkpoint_async:
        stall = per_gpu / (cluster.gpu.host_link_bytes_per_s * assume.host_link_efficiency)
        staging = per_gpu
    else:
        stall, staging = write_s, 0
    return CheckpointPlan(assume.checkpoint_async, total, m.act_bytes * m.param_count, per_gpu, staging, stall,
                          write_s)


@dataclass
class Plan:
    model: ModelShape
    layout: Layout
    cluster: Cluster | None
    assume: Assumptions
    memory: MemoryPlan
    time: TimePlan | None
    process_baseline_bytes: int = 0
    problems: list[str] = field(default_factory=list)  # why it does not fit (empty: fits)
    notes: list[str] = field(default_factory=list)
    checkpoint: CheckpointPlan | None = None  # size, stall and host staging of a checkpoint (GPU plans)

    @property
    def device(self) -> str:
        return "cpu" if self.cluster is None else self.cluster.gpu.name

    @property
    def peak_gpu_bytes(self) -> int:
        """Peak of live tensors on one device (CPU: plus the process baseline)."""
        return self.memory.peak_bytes + self.process_baseline_bytes

    @property
    def needed_gpu_bytes(self) -> int:
        """The peak plus the allocator's overhead and the runtime's reserve (what must fit a GPU)."""
        return int(self.peak_gpu_bytes * (1 + self.assume.fragmentation) + self.assume.runtime_reserved_gib * GiB)

    @property
    def host_bytes_per_gpu(self) -> int:
        return self.memory.host_bytes_per_gpu

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def step_time_s(self) -> float | None:
        return None if self.time is None else self.time.step_time_s

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.time is None else self.time.tokens_per_s


def make_plan(model: ModelShape, layout: Layout, cluster: Cluster | None, assume: Assumptions | None = None,
              process_baseline_bytes: int = 0) -> Plan:
    """Evaluate one layout. Raises GenomeLMError for layouts that cannot run at all."""
    assume = assume or Assumptions()
    layout.check()
    # `command.build` makes the layout for the cluster's GPUs; a CPU plan is for one process
    assert layout.gpus == (1 if cluster is None else cluster.gpus), "the layout's cp x dp is the cluster's GPUs"
    backend = assume.kda_backend if assume.kda_backend != "auto" else "torch" if cluster is None else "fla"
    memory = plan_memory(model, layout, assume, cluster is not None, backend)
    time = None if cluster is None else plan_time(model, layout, assume, cluster, backend)
    plan = Plan(model, layout, cluster, assume, memory, time, process_baseline_bytes)
    if cluster is None:
        return plan
    c, a, par = cluster, assume, layout.parallel
    plan.checkpoint = plan_checkpoint(model, layout, assume, cluster)
    staging = plan.checkpoint.staging_host_bytes_per_gpu  # pinned host memory beside offload's
    need = plan.needed_gpu_bytes  # the reasons it does not fit, then the notes
    if need > c.gpu.memory_bytes:
        plan.problems.append(f"GPU memory: needs {need / GiB:.1f} GiB (peak {memory.peak_bytes / GiB:.1f} + "
                             f"{a.fragmentation:.0%} allocator + {a.runtime_reserved_gib:g} GiB runtime) > "
                             f"{c.gpu.memory_bytes / GiB:.1f} GiB, peak at {memory.peak_where}")
    if layout.memory.offload_layer_inputs and not a.pinned_available:
        plan.problems.append("host memory: offload needs pinned host memory (pinned_available=false)")
    per_node = (plan.host_bytes_per_gpu + staging) * c.gpus_per_node
    if per_node > c.host_memory_per_node * a.host_usable_fraction:
        staged = (f" (with {staging * c.gpus_per_node / GiB:,.0f} GiB of async checkpoint staging)" if staging else "")
        plan.problems.append(f"host memory: {per_node / GiB:,.0f} GiB pinned per node{staged} > "
                             f"{a.host_usable_fraction:.0%} of {c.host_memory_per_node / GiB:,.0f} GiB")
    if par.ep > 1:
        plan.notes.append(f"ep={par.ep}: the busiest expert rank is assumed {a.expert_imbalance:g}x the mean (the "
                          "trainer logs it per step: ep_rank_imbalance)")
    if par.cp > c.gpus_per_node:
        plan.notes.append(f"cp={par.cp} spans nodes: CP all-gathers go over the network")
    return plan


STRATEGIES = (("none", ()), ("selective", ("moe",)), ("selective", ("dsa", "moe")), ("per-layer", ()))
BLOCKS = {"dsa_block_queries": ("dsa", 4096, 128), "moe_block_tokens": ("moe", 65536, 1024),
          "loss_chunk_tokens": ("loss", 16384, 1024)}  # field: (the op at the peak it sizes, largest, smallest)


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
    """The search of `genome-lm plan --fit` and benchmarks/plan_table.py. Searched: cp (powers of two
    dividing the GPUs; dp = GPUs / cp), ep (`eps`, default `ep_choices`), `STRATEGIES`, layer-input offload
    and MoE block recompute; the other keys are the given layout's. Block sizes start at their largest and
    the block of the op at the peak is halved until the layout fits: they do not change the first-order step
    time, so the largest blocks that fit are kept. The highest estimated tokens/s wins; ties go to less host
    memory, then to the lower peak."""
    given_plan = make_plan(model, given, cluster, assume)
    plans: list[Plan] = []
    largest = {k: v[1] for k, v in BLOCKS.items()}
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
            key = next((k for k, (op, *_) in BLOCKS.items() if op in plan.memory.peak_where.split(":")[-1]), None)
            if key is None or getattr(layout.memory, key) // 2 < BLOCKS[key][2]:
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

