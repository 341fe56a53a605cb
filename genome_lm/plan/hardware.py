"""GPU and node specifications: vendor peak figures per GPU (bandwidths per direction; the achieved
fraction is an assumption). The table and its sources: docs/plan.md (Hardware).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from genome_lm.errors import GenomeLMError

GiB = 2**30
MiB = 2**20
GB = 10**9
TB = 10**12


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator. Bandwidths are per GPU and per direction, in bytes/s."""

    name: str
    memory_bytes: int
    bf16_flops: float  # dense tensor-core peak
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # scale-up fabric inside a node
    host_link_bytes_per_s: float  # GPU <-> host memory (PCIe)
    network_bytes_per_s: float  # scale-out NIC bandwidth per GPU (between nodes)
    host_memory_per_node: int
    gpus_per_node: int = 8


GPUS: dict[str, GPUSpec] = {
    "b200": GPUSpec("b200", 183_359 * MiB, 2.25e15, 7.67 * TB, 900 * GB, 64 * GB, 50 * GB, 2 * 1024 * GiB),
    "h200": GPUSpec("h200", 143_771 * MiB, 0.989e15, 4.8 * TB, 450 * GB, 64 * GB, 50 * GB, 2 * 1024 * GiB),
    "h100": GPUSpec("h100", 81_559 * MiB, 0.989e15, 3.35 * TB, 450 * GB, 64 * GB, 50 * GB, 2 * 1024 * GiB),
}


@dataclass(frozen=True)
class Cluster:
    """`gpus` accelerators of one kind, `gpus_per_node` to a node (NVLink inside, NICs between)."""

    gpu: GPUSpec
    gpus: int
    gpus_per_node: int
    host_memory_per_node: int

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)


def make_cluster(gpu: str = "b200", gpus: int = 8, gpus_per_node: int | None = None,
                 gpu_mem: int | None = None, host_mem: int | None = None) -> Cluster:
    """A cluster description; `gpu_mem` / `host_mem` (bytes) override the spec's figures."""
    if gpu.strip().lower() not in GPUS:
        raise GenomeLMError(f"--gpu: unknown GPU {gpu!r}; use one of {', '.join(GPUS)} "
                            "(and --gpu-mem / --host-mem to describe anything else)")
    spec = GPUS[gpu.strip().lower()]
    if gpus < 1:
        raise GenomeLMError(f"--gpus: need at least 1 GPU, got {gpus}")
    per_node = spec.gpus_per_node if gpus_per_node is None else gpus_per_node  # >= 1: PlanParams checks it
    if gpus > per_node and gpus % per_node:
        raise GenomeLMError(f"--gpus {gpus} is not a whole number of {per_node}-GPU nodes; "
                            "use a multiple of --gpus-per-node")
    if gpu_mem is not None:
        if gpu_mem < 1 * GiB:
            raise GenomeLMError(f"--gpu-mem: {gpu_mem:,} bytes is not a GPU memory size; use e.g. 180GiB")
        spec = replace(spec, memory_bytes=int(gpu_mem))
    host = spec.host_memory_per_node if host_mem is None else int(host_mem)
    if host < 1 * GiB:
        raise GenomeLMError(f"--host-mem: {host:,} bytes is not a node's host memory; use e.g. 2TiB")
    return Cluster(gpu=spec, gpus=gpus, gpus_per_node=min(per_node, gpus), host_memory_per_node=host)
