"""The hardware a plan is for: GPU and node specifications, vendor peak figures per GPU (bandwidths per
direction; sources: docs/plan.md, Hardware), and `Assumptions`: every assumption the planner makes that is not
a count of bytes or FLOPs (the achieved fractions of those peaks among them), each with its reason and
overridable with `--assume KEY=VALUE` (docs/plan.md says how each default was chosen).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from genome_lm.errors import GenomeLMError
from genome_lm.options import apply_override, validate
from genome_lm.settings import DEFAULTS, KDABackend

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
    per_node = spec.gpus_per_node if gpus_per_node is None else gpus_per_node  # gpus, per_node >= 1: PlanParams
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


def _share(default: float, why: str):
    """A fraction of a peak, in (0, 1]."""
    return Field(default, gt=0, le=1, description=why)


class Assumptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- compute ---
    matmul_efficiency: float = _share(0.45, "fraction of the BF16 dense peak reached by GEMMs (projections, grouped "
                                            "experts, LM head).")
    attention_efficiency: float = _share(0.25, "fraction of peak reached by the long-context kernels: fla KDA, DSA "
                                               "indexer and sparse attention.")
    hbm_efficiency: float = _share(0.7, "fraction of HBM bandwidth reached by memory-bound work (gathers, elementwise, "
                                        "casts).")
    elementwise_passes: float = Field(4.0, description="HBM passes over each saved activation byte per step: "
                                      "written in forward, read in backward, its gradient written and read "
                                      "(first-order traffic of the non-GEMM ops).")
    # --- links ---
    nvlink_efficiency: float = _share(0.7, "fraction of NVLink bandwidth reached by NCCL collectives inside a node.")
    network_efficiency: float = _share(0.8, "fraction of NIC bandwidth reached by collectives between nodes.")
    host_link_efficiency: float = _share(0.8, "fraction of PCIe bandwidth reached by pinned-memory copies (offloaded "
                                              "layer inputs).")
    offload_keeps_device_input: bool = Field(False, description="true models a recompute whose closure captures "
                                             "the layer's arguments, so an offloaded input's device tensor stays "
                                             "alive until backward (offload then adds a host copy and frees "
                                             "nothing); false models genome_lm.train's offload (device copy "
                                             "released).")
    offload_prefetch: bool = Field(False, description="whether the next layer input is copied back ahead of its "
                                   "backward (genome_lm.train does not: the copy starts when the layer's backward "
                                   "starts, so it is on the critical path).")
    # --- parallelism ---
    expert_imbalance: float = Field(4.0, ge=1, description="tokens on the busiest expert rank / mean (the "
                                    "reference run saw 4x). Matters only with expert parallelism (ep > 1): "
                                    "without it every rank runs all its tokens through all experts.")
    shard_over_cp: bool = Field(True, description="FSDP2 shards over the dp x cp mesh (cp ranks hold the same "
                                "parameters, as in Megatron).")
    fsdp_prefetch_layers: int = Field(1, description="layers whose parameters FSDP2 all-gathers ahead of the one "
                                      "computing in forward (backward: parallel.backward_prefetch).")
    fsdp_overlap: float = Field(1.0, ge=0, le=1, description="fraction of FSDP2 all-gather / reduce-scatter time "
                                "hidden behind compute.")
    adamw_temp_copies: float = Field(1.0, description="temporaries of the foreach AdamW step, in units of the "
                                     "sharded parameter bytes (sqrt(v)).")
    # --- memory capacity ---
    runtime_reserved_gib: float = Field(3.0, ge=0, description="GPU memory outside PyTorch tensors: CUDA context, "
                                        "cuBLAS/NCCL workspaces and buffers.")
    fragmentation: float = Field(0.05, ge=0, description="caching-allocator overhead on top of the peak of live "
                                 "tensors, for the fits check only.")
    pinned_available: bool = Field(True, description="whether the job may pin host memory (false e.g. under a "
                                   "low memlock limit: offload impossible).")
    pinned_pow2: bool = Field(True, description="PyTorch's CachingHostAllocator rounds each pinned block up to a "
                              "power of two.")
    host_usable_fraction: float = _share(0.9, "share of a node's host memory that pinned buffers may take (OS, data "
                                              "loading, page cache).")
    # --- checkpoints ---
    checkpoint_write_gbps: float = Field(10.0, gt=0, description="aggregate bandwidth (GB/s) of the shared "
                                         "filesystem the run writes its checkpoints to, all ranks together.")
    checkpoint_async: bool = Field(True, description="train.checkpoint_mode async (the default): training waits "
                                   "only while each GPU copies its shard to pinned host memory, which the staged "
                                   "copy holds until the background write ends; false: sync, training waits for "
                                   "the write. Taken from the experiment's train.checkpoint_mode unless given.")
    kda_backend: KDABackend = Field(DEFAULTS.kda_backend, description="'fla' (Triton kernels, CUDA), 'torch' "
                                    "(genome_lm's chunked op), or 'auto' (fla on GPUs): memory.kda_backend.")

    def override(self, assignments: list[str] | tuple[str, ...]) -> "Assumptions":
        """Apply `key=value` overrides, or the `assume` object of a JSON file (what
        benchmarks/gpu_check.py measured); unknown keys and bad values are one-line errors."""
        raw = self.model_dump()
        for item in assignments:
            if "=" not in item and item.endswith(".json"):
                try:
                    found = json.loads(Path(item).read_text()).get("assume")
                except (OSError, ValueError, AttributeError) as e:
                    raise GenomeLMError(f"--assume {item}: cannot read it as JSON ({e}); "
                                        "give KEY=VALUE or a gpu_check.json") from None
                if not isinstance(found, dict):
                    raise GenomeLMError(f"--assume {item}: no 'assume' object in it; benchmarks/gpu_check.py "
                                        "writes one on a GPU")
                raw.update(found)
            else:
                example = f"{item}=VALUE" if item in raw else "matmul_efficiency=0.35"
                apply_override(raw, item, "--assume", example=example)
        return validate(Assumptions, raw, "--assume")
