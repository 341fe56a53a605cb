"""Every assumption the planner makes that is not a count of bytes or FLOPs, in one place.

Each field has a default, a one-line reason, and can be overridden: `genome-lm plan ...
--assume matmul_efficiency=0.35 --assume expert_imbalance=2`. The plan prints the values it
used, so a reader always sees what a number rests on. Nothing here was tuned to make the
reference run's published figures come out; see docs/plan.md for how each default was chosen.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from genome_lm.errors import GenomeLMError


@dataclass(frozen=True)
class Assumptions:
    # --- compute ---
    matmul_efficiency: float = 0.45
    """fraction of the BF16 dense peak reached by GEMMs (projections, grouped experts, LM head)."""
    attention_efficiency: float = 0.25
    """fraction of peak reached by the long-context kernels: fla KDA, DSA indexer and sparse attention."""
    hbm_efficiency: float = 0.7
    """fraction of HBM bandwidth reached by memory-bound work (gathers, elementwise, casts)."""
    elementwise_passes: float = 4.0
    """HBM passes over each saved activation byte per step: written in forward, read in backward,
    its gradient written and read (first-order traffic of the non-GEMM ops)."""
    # --- links ---
    nvlink_efficiency: float = 0.7
    """fraction of NVLink bandwidth reached by NCCL collectives inside a node."""
    network_efficiency: float = 0.8
    """fraction of NIC bandwidth reached by collectives between nodes."""
    host_link_efficiency: float = 0.8
    """fraction of PCIe bandwidth reached by pinned-memory copies (offloaded layer inputs)."""
    offload_keeps_device_input: bool = False
    """true models genome_lm.train as of this commit: checkpoint_module's recompute closure captures the
    layer's arguments, so an offloaded input's device tensor stays alive until backward (offload then
    adds a host copy and frees nothing); false models offload as designed (device copy released)."""
    offload_prefetch: bool = False
    """whether the next layer input is copied back ahead of its backward (genome_lm.train does not:
    the copy starts when the layer's backward starts, so it is on the critical path)."""
    # --- parallelism ---
    expert_imbalance: float = 4.0
    """tokens on the busiest expert rank / mean (the reference run saw 4x). Matters only with
    expert parallelism (ep > 1): without it every rank runs all its tokens through all experts."""
    shard_over_cp: bool = True
    """FSDP2 shards over the dp x cp mesh (cp ranks hold the same parameters, as in Megatron)."""
    fsdp_prefetch_layers: int = 1
    """layers whose parameters FSDP2 all-gathers ahead of the one computing."""
    fsdp_overlap: float = 1.0
    """fraction of FSDP2 all-gather / reduce-scatter time hidden behind compute."""
    reduce_dtype_bytes: int = 4
    """bytes per element of the gradient reduce-scatter (MixedPrecisionPolicy reduce_dtype=float32)."""
    adamw_temp_copies: float = 1.0
    """temporaries of the foreach AdamW step, in units of the sharded parameter bytes (sqrt(v))."""
    # --- memory capacity ---
    runtime_reserved_gib: float = 3.0
    """GPU memory outside PyTorch tensors: CUDA context, cuBLAS/NCCL workspaces and buffers."""
    fragmentation: float = 0.05
    """caching-allocator overhead on top of the peak of live tensors, for the fits check only."""
    pinned_available: bool = True
    """whether the job may pin host memory (false e.g. under a low memlock limit: offload impossible)."""
    pinned_pow2: bool = True
    """PyTorch's CachingHostAllocator rounds each pinned block up to a power of two."""
    host_usable_fraction: float = 0.9
    """share of a node's host memory that pinned buffers may take (OS, data loading, page cache)."""
    kda_backend: str = "auto"
    """'fla' (Triton kernels, CUDA), 'torch' (genome_lm's chunked op), or 'auto' (fla on GPUs)."""

    def override(self, assignments: list[str] | tuple[str, ...]) -> "Assumptions":
        """Apply `key=value` overrides, or the `assume` object of a JSON file (what
        benchmarks/gpu_check.py measured); unknown keys and bad values are one-line errors."""
        known = {f.name: f for f in fields(self)}
        values = {}
        expanded = []
        for item in assignments:
            if "=" not in item and item.endswith(".json"):
                expanded += [f"{k}={v}" for k, v in _assume_file(item).items()]
            else:
                expanded.append(item)
        for item in expanded:
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise GenomeLMError(f"--assume {item!r}: expected KEY=VALUE with KEY one of {', '.join(known)}")
            values[key] = _convert(key, raw.strip(), type(getattr(self, key)))
        new = dataclasses.replace(self, **values)
        new.check()
        return new

    def check(self) -> None:
        for name in ("matmul_efficiency", "attention_efficiency", "hbm_efficiency", "nvlink_efficiency",
                     "network_efficiency", "host_link_efficiency", "host_usable_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise GenomeLMError(f"--assume {name}={getattr(self, name)}: must be in (0, 1]")
        if self.expert_imbalance < 1:
            raise GenomeLMError(f"--assume expert_imbalance={self.expert_imbalance}: must be >= 1 (busiest / mean)")
        if self.kda_backend not in ("auto", "fla", "torch"):
            raise GenomeLMError(f"--assume kda_backend={self.kda_backend}: use auto, fla or torch")
        if not 0 <= self.fsdp_overlap <= 1 or self.fragmentation < 0 or self.runtime_reserved_gib < 0:
            raise GenomeLMError("--assume: fsdp_overlap must be in [0, 1]; fragmentation and runtime_reserved_gib >= 0")

    def describe(self) -> dict[str, dict]:
        """{name: {"value": v, "why": docstring}} for reports and JSON."""
        docs = _field_docs()
        return {f.name: {"value": getattr(self, f.name), "why": docs.get(f.name, "")} for f in fields(self)}


def _convert(key: str, raw: str, kind: type):
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return kind(raw)
    except ValueError:
        raise GenomeLMError(f"--assume {key}={raw}: expected a {kind.__name__}") from None


def _field_docs() -> dict[str, str]:
    """Attribute docstrings (the string literal after each field) read from the source."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(Assumptions)))
    body = tree.body[0].body
    docs = {}
    for prev, node in zip(body, body[1:]):
        if isinstance(prev, ast.AnnAssign) and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docs[prev.target.id] = " ".join(str(node.value.value).split())
    return docs


def _assume_file(path: str) -> dict:
    import json
    from pathlib import Path

    try:
        found = json.loads(Path(path).read_text()).get("assume")
    except (OSError, ValueError, AttributeError) as e:
        raise GenomeLMError(f"--assume {path}: cannot read it as JSON ({e}); "
                            "give KEY=VALUE or a gpu_check.json") from None
    if not isinstance(found, dict):
        raise GenomeLMError(f"--assume {path}: no 'assume' object in it; benchmarks/gpu_check.py writes one on a GPU")
    return found
