"""One place that turns a single-device model into the one that trains, in the fixed order of
docs/architecture.md ("`parallelize`: order and precision"), as torchtitan's `parallelize`; out of order raises
an error naming it. An offloaded module parks its inputs in (pinned) host memory, and in backward takes them
back, starts the copy back of the next module's inputs on a side stream (overlapping its own backward; the host
never waits), and replays its forward with the same RNG state. On CPU the copy goes to a separate host buffer."""

from __future__ import annotations

import functools
import logging
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import FSDPModule

from genome_lm.config import MemoryConfig
from genome_lm.model import apply_long_context
from genome_lm.model.causal_lm import Glm5NextCausalLM
from genome_lm.model.ops import swap_class
from genome_lm.parallel import apply_context_parallel, apply_expert_parallel, apply_fsdp, to_master_dtype_
from genome_lm.parallel.mesh import ParallelContext

log = logging.getLogger(__name__)


class _HostCopy:
    """An input tensor parked in host memory (pinned on CUDA): copied out and back (`prefetch`) on the offload
    stream, `back` makes the compute stream wait for it. CPU: a plain copy, or a new tensor on `host_device`."""

    in_use = 0  # host bytes held by live copies, and the most since `reset_peak`
    peak = 0

    def __init__(self, t: torch.Tensor, stream: torch.cuda.Stream | None, host_device: torch.device | None = None):
        self.device, self.stream, self.nbytes = t.device, stream, t.nbytes
        self.on_device: torch.Tensor | None = None
        self.host: torch.Tensor | None  # None once `back` has handed the tensor back
        if t.is_cuda:
            assert stream is not None  # `_stream_for` gives every CUDA device its stream
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            stream.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(stream):
                self.host.copy_(t, non_blocking=True)
                self.copied_out = torch.cuda.Event()
                self.copied_out.record(stream)
            t.record_stream(stream)  # keep t alive until the copy is done
        elif host_device is not None:  # the rehearsal: a host tensor elsewhere, as on CUDA (fake tensors: no copy)
            self.host = torch.empty_like(t, device=host_device)
        else:
            self.host = t.detach().clone()
        _HostCopy.in_use += self.nbytes
        _HostCopy.peak = max(_HostCopy.peak, _HostCopy.in_use)

    def prefetch(self) -> None:
        if self.on_device is not None:
            return
        host = self.host
        assert host is not None  # the host copy goes only in `back`, after the copy back
        if self.device.type != "cuda":
            self.on_device = host if host.device == self.device else torch.empty_like(host, device=self.device)
            return
        stream = self.stream
        assert stream is not None  # set for every CUDA tensor
        with torch.cuda.stream(stream):
            stream.wait_event(self.copied_out)
            self.on_device = host.to(self.device, non_blocking=True)
            self.copied_in = torch.cuda.Event()
            self.copied_in.record(stream)

    def back(self) -> torch.Tensor:
        """The tensor on its device, usable on the current stream; the host copy is released."""
        self.prefetch()
        t = self.on_device
        assert t is not None  # `prefetch` has set it
        if self.device.type == "cuda":
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self.copied_in)
            t.record_stream(current)
        self.host = self.on_device = None
        _HostCopy.in_use -= self.nbytes
        return t

    def __del__(self):  # a graph dropped without its backward
        if getattr(self, "host", None) is not None:
            _HostCopy.in_use -= self.nbytes


# Parked inputs of the offloaded modules whose backward has not run yet, in forward order (weak:
# a graph that is dropped without a backward takes its copies with it). Backward runs them in
# reverse, so each module's backward prefetches the inputs of the one parked before it.
_PARKED: list[weakref.ref] = []


def host_bytes(reset_peak: bool = False) -> tuple[int, int]:
    """(host bytes the offloaded inputs hold now, the most they held since the last reset)."""
    out = (_HostCopy.in_use, _HostCopy.peak)
    if reset_peak:
        _HostCopy.peak = _HostCopy.in_use
    return out


@functools.cache
def _stream_for(device: torch.device):
    return torch.cuda.Stream(device) if device.type == "cuda" else None


class _Parked(list):
    """The parked arguments of one forward (a list that a weak reference can point to)."""


class _Recompute(torch.autograd.Function):
    """forward(run, host_device, *tensors) -> run(*tensors) without activations, the tensors parked on the host."""

    @staticmethod
    def forward(ctx, run: Callable, host_device: torch.device | None, *tensors: torch.Tensor):
        ctx.run = run
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        ctx.parked = _Parked(_HostCopy(t, _stream_for(t.device), host_device) if isinstance(t, torch.Tensor) else t
                             for t in tensors)
        _PARKED.append(weakref.ref(ctx.parked))
        with torch.no_grad():
            out = run(*tensors)
        outs = out if isinstance(out, tuple) else (out,)
        ctx.mark_non_differentiable(*[o for o in outs if isinstance(o, torch.Tensor) and not o.is_floating_point()])
        return outs

    @staticmethod
    def backward(ctx, *grads):
        parked = ctx.parked
        del ctx.parked
        if _PARKED and _PARKED[-1]() is parked:
            _PARKED.pop()
        inputs = [p.back() if isinstance(p, _HostCopy) else p for p in parked]
        del parked  # the host copies go now, the device inputs after this module's backward
        while _PARKED and _PARKED[-1]() is None:  # graphs dropped without their backward
            _PARKED.pop()
        for p in (_PARKED[-1]() or []) if _PARKED else []:  # the next module to run backward: back during this one
            if isinstance(p, _HostCopy):
                p.prefetch()
        inputs = [t.detach().requires_grad_(t.is_floating_point() and g) if isinstance(t, torch.Tensor) else t
                  for t, g in zip(inputs, ctx.needs_input_grad[2:])]
        rng_devices = list(range(torch.cuda.device_count())) if ctx.cuda_rng is not None else []
        with torch.random.fork_rng(devices=rng_devices):
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state_all(ctx.cuda_rng)
            with torch.enable_grad():
                out = ctx.run(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *[t.grad if isinstance(t, torch.Tensor) and t.requires_grad else None for t in inputs])


if TYPE_CHECKING:
    _ModuleMixin = nn.Module  # what the mixin is combined with (`recompute`): `super()` is a module
else:
    _ModuleMixin = object


class _OffloadedRecompute(_ModuleMixin):
    """Mixin: `forward` recomputes in backward, its tensor arguments parked in host memory (or `host_device`)."""

    host_device: torch.device | None = None

    def extra_repr(self) -> str:
        inner = super().extra_repr()
        return f"{inner}, recompute=offload" if inner else "recompute=offload"

    def forward(self, *args, **kwargs):
        inner = super().forward
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        template: dict[Any, Any] = {**dict(enumerate(args)), **kwargs}  # positions and names -> arguments
        slots = [k for k, v in template.items() if isinstance(v, torch.Tensor)]
        # The replay closure must not hold the tensors themselves: the saved copy lives in host
        # memory and the device tensor has to be free to go after the forward.
        tensors = [template.pop(k) for k in slots]
        n_args, returns_tuple = len(args), []

        def run(*ts):
            full = {**template, **dict(zip(slots, ts))}
            out = inner(*[full[i] for i in range(n_args)], **{k: v for k, v in full.items() if isinstance(k, str)})
            returns_tuple.append(isinstance(out, tuple))
            return out

        del args, kwargs
        outs = _Recompute.apply(run, self.host_device, *tensors)
        return outs if returns_tuple[0] else outs[0]


_OFFLOADED: dict[type, type] = {}


def recompute(module: nn.Module, offload: bool = False) -> nn.Module:
    """Make `module` recompute its activations in backward (in place): torch's composable `checkpoint`, or
    with offload an `Offloaded<Class>` subclass, as torch's keeps the inputs referenced on the device until
    backward (`save_on_cpu` around it would free nothing); ours keeps only the host copy."""
    if not offload:
        return checkpoint(module)
    cls = type(module)
    if cls not in _OFFLOADED:
        _OFFLOADED[cls] = type(f"Offloaded{cls.__name__}", (_OffloadedRecompute, cls), {})
    return swap_class(module, _OFFLOADED[cls])


def park_host_copies_on(model: nn.Module, device: str | torch.device) -> None:
    """Every offloaded module of `model` parks a non-CUDA input as a new tensor on `device` (the rehearsal's
    "meta": its memory tracker sees the device input freed)."""
    for m in model.modules():
        if isinstance(m, _OffloadedRecompute):
            m.host_device = torch.device(device)


def apply_recompute(model: Glm5NextCausalLM, memory: MemoryConfig) -> list[str]:
    """Recompute decoder layers (per-layer) or their attention / MLP sub-modules (selective); the names wrapped."""
    if memory.recompute == "none":
        return []
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise RuntimeError("apply_recompute: recompute before FSDP2 shards the model (see train/parallelize.py)")
    targets, layers = {}, model.model.layers
    for i, layer in enumerate(layers):
        if memory.recompute == "per-layer":
            targets[f"layers.{i}"] = (i, layer)
            continue
        kinds = {"self_attn": "kda" if layer.block_type == "linear_attention" else "dsa",
                 "mlp": "moe" if hasattr(layer.mlp, "experts") else "dense"}
        for name, kind in kinds.items():
            if kind in memory.recompute_layers:
                targets[f"layers.{i}.{name}"] = (i, layer.get_submodule(name))
    for i, module in targets.values():  # the last offload_keep_last layers keep their inputs on the device
        recompute(module, offload=memory.offload_layer_inputs and i < len(layers) - memory.offload_keep_last)
    return list(targets)


def parallelize(model: Glm5NextCausalLM, memory: MemoryConfig, parallel: ParallelContext | None = None,
                compute_dtype: torch.dtype | None = None) -> nn.Module:
    """`model` made ready to train, in place. `compute_dtype`: bf16 for a bf16 model (needs a sharded
    `parallel`), None for the parameters' own."""
    apply_long_context(model, dsa_block_queries=memory.dsa_block_queries, moe_block_tokens=memory.moe_block_tokens,
                       loss_chunk_tokens=memory.loss_chunk_tokens, moe_recompute=memory.moe_recompute,
                       kda_head_block=memory.kda_head_block, kda_backend=memory.kda_backend)
    if parallel is not None and parallel.cp > 1:
        apply_context_parallel(model, parallel.cp_group)
    ep_mesh = getattr(parallel, "ep_mesh", None)
    if ep_mesh is not None:
        apply_expert_parallel(model, ep_mesh)
    wrapped = apply_recompute(model, memory)
    if parallel is not None and parallel.sharded:
        if compute_dtype not in (None, torch.float32):
            to_master_dtype_(model)
        apply_fsdp(model, parallel.fsdp_mesh, compute_dtype=compute_dtype,
                   expert_mesh=ep_mesh["edp"] if ep_mesh is not None else None,
                   reduce_dtype=getattr(torch, parallel.reduce_dtype), backward_prefetch=parallel.backward_prefetch)
    log.info("memory strategy: recompute=%s%s, offload=%s, %d modules wrapped", memory.recompute,
             f" {memory.recompute_layers}" if memory.recompute == "selective" else "", memory.offload_layer_inputs,
             len(wrapped))
    return model
