"""`make_plan(...)`: memory per GPU, host memory, step time, checkpoint cost and whether it all fits.

On a CPU (`cluster=None`) the plan predicts the trainer's `peak_mem_bytes` there: the process's peak
resident set = `process_baseline_bytes` (measured by the caller) + the step's gradients, activations
and transients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genome_lm.errors import GenomeLMError
from genome_lm.plan.assumptions import Assumptions
from genome_lm.plan.hardware import GB, Cluster, GiB
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

    def describe(self, write_gbps: float) -> str:
        mode = "async (staged in pinned host memory)" if self.asynchronous else "sync"
        return (f"checkpoint ({mode}): train_state {self.train_state_bytes / 1e12:,.2f} TB "
                f"({self.state_bytes_per_gpu / GB:,.1f} GB per GPU), model/ {self.export_bytes / 1e12:,.2f} TB when "
                f"exported; training stalls {self.stall_s:,.1f} s per checkpoint, the write takes "
                f"{self.write_s:,.0f} s at {write_gbps:g} GB/s (--assume checkpoint_write_gbps)")


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
    def staging_host_bytes_per_gpu(self) -> int:
        """Pinned host memory an asynchronous checkpoint stages per GPU, beside offload's."""
        return self.checkpoint.staging_host_bytes_per_gpu if self.checkpoint else 0

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
    if cluster is not None and layout.gpus != cluster.gpus:
        raise GenomeLMError(f"layout cp={layout.parallel.cp} x dp={layout.dp} = {layout.gpus} GPUs, but the cluster "
                            f"has {cluster.gpus}; change --gpus or the experiment's parallel section")
    if cluster is None and layout.gpus != 1:
        raise GenomeLMError("a CPU plan is for one process: cp = dp = 1")
    backend = assume.kda_backend if assume.kda_backend != "auto" else "torch" if cluster is None else "fla"
    memory = plan_memory(model, layout, assume, "cpu" if cluster is None else "gpu", backend)
    time = None if cluster is None else plan_time(model, layout, assume, cluster, backend)
    plan = Plan(model, layout, cluster, assume, memory, time, process_baseline_bytes)
    if cluster is None:
        return plan
    c, a, par = cluster, assume, layout.parallel
    plan.checkpoint = plan_checkpoint(model, layout, assume, cluster)
    need = plan.needed_gpu_bytes  # the reasons it does not fit, then the notes
    if need > c.gpu.memory_bytes:
        plan.problems.append(f"GPU memory: needs {need / GiB:.1f} GiB (peak {memory.peak_bytes / GiB:.1f} + "
                             f"{a.fragmentation:.0%} allocator + {a.runtime_reserved_gib:g} GiB runtime) > "
                             f"{c.gpu.memory_bytes / GiB:.1f} GiB, peak at {memory.peak_where}")
    if layout.memory.offload_layer_inputs and not a.pinned_available:
        plan.problems.append("host memory: offload needs pinned host memory (pinned_available=false)")
    staging = plan.staging_host_bytes_per_gpu
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
