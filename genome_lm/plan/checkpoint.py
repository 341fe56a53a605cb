"""What a training checkpoint costs at a layout: its size, the host memory an asynchronous save stages
it in, and how long training waits for it.

    ck = plan_checkpoint(shape, layout, assume, cluster)
    ck.stall_s, ck.write_s, ck.staging_host_bytes_per_gpu, ck.train_state_bytes

A checkpoint's `train_state/` holds, per parameter, the float32 master weight and the two AdamW
moments (4 + 2 x train.optimizer_state_dtype bytes), sharded like training (each GPU writes its
1/shard-degree); `model/` adds the weights in the model's dtype when train.export_model writes it
(`last` for the full-size experiments, so not at every checkpoint).

- `checkpoint_async` (train.checkpoint_mode: async): training waits while each GPU copies its shard
  to pinned host memory (`stall_s`: shard bytes over the host link at host_link_efficiency); a
  background thread then writes every shard to the filesystem (`write_s`: all bytes at
  `checkpoint_write_gbps`, the shared filesystem's aggregate bandwidth). The staged copy stays in
  host memory until the write ends: `staging_host_bytes_per_gpu`, beside offload's pinned layer inputs.
- sync: training waits for the whole write (`stall_s` = `write_s`), and stages nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from genome_lm.plan.assumptions import Assumptions
from genome_lm.plan.hardware import Cluster
from genome_lm.plan.layout import Layout
from genome_lm.plan.memory import MASTER_BYTES, shard_degree
from genome_lm.plan.shapes import ModelShape

GB = 1e9


@dataclass
class CheckpointPlan:
    asynchronous: bool
    train_state_bytes: int  # the whole train_state/ (all ranks)
    export_bytes: int  # model/ in the model's dtype
    state_bytes_per_gpu: int  # what each GPU writes (and, asynchronously, stages)
    staging_host_bytes_per_gpu: int  # pinned host memory of the staged copy (0 when sync)
    stall_s: float  # training waits this long per checkpoint
    write_s: float  # writing train_state/ at the assumed filesystem bandwidth

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def describe(self, write_gbps: float) -> str:
        mode = "async (staged in pinned host memory)" if self.asynchronous else "sync"
        return (f"checkpoint ({mode}): train_state {self.train_state_bytes / 1e12:,.2f} TB "
                f"({self.state_bytes_per_gpu / GB:,.1f} GB per GPU), model/ {self.export_bytes / 1e12:,.2f} TB when "
                f"exported; training stalls {self.stall_s:,.1f} s per checkpoint, the write takes "
                f"{self.write_s:,.0f} s at {write_gbps:g} GB/s (--assume checkpoint_write_gbps)")


def plan_checkpoint(m: ModelShape, layout: Layout, assume: Assumptions, cluster: Cluster) -> CheckpointPlan:
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
