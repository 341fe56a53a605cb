"""`genome-lm rehearse EXP --gpus N --gpu b200`: one full-size training step measured on a CPU.

torchtitan's memory estimator pattern (docs/plan.md, Rehearsal): the real model is built on the meta
device, joins a fake process group of N ranks (`FakeStore`, one rank simulated), goes through the
trainer's `parallelize`, becomes fake tensors and runs `steps` of the trainer's `train_step` under
torch's `FSDPMemTracker`. What fake tensors cannot decide comes from `model/patch.use_fake_values`
(routing, skipped value checks, fla stand-ins); offloaded inputs are parked on the meta device and
counted as host memory. With fewer `layers`, the omitted layers' shards, AdamW state and gradients
are added: exact when they keep nothing on the device (per-layer recompute with offload).
"""

from __future__ import annotations

import time
from copy import deepcopy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

from genome_lm.errors import GenomeLMError

if TYPE_CHECKING:
    from genome_lm.plan.planner import Plan


KINDS = {  # the report's groups: (the tracker's kinds, the planner's breakdown keys)
    "parameters (sharded, float32)": (("Sharded Param", "Buffer"), ("parameters",)),
    "optimizer state (and the step's temporaries)": (("OptState",), ("optimizer_states", "optimizer_temp")),
    "gradients (sharded, float32)": (("Sharded Grad",), ("gradients",)),
    "FSDP2 buffers (gathered parameters, gradients)": (("Unsharded Param", "Unsharded Grad", "All Gather",
                                                        "Reduce Scatter"), ("fsdp_buffers", "fsdp_root_unsharded")),
    "activations and temporaries": (("Activation", "Temp", "Inputs"), ("kept_activations", "current_layer",
                                    "op_transient", "grad_streams", "inputs", "final", "loss_chunk")),
}
OPTIMIZER = "optimizer step"


@dataclass
class Peak:
    """The live bytes by tracker kind at one peak, where it was (phase, module)."""

    phase: str
    module: str
    kinds: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.kinds.values())  # `_lift` leaves the tracker's "Total" out


@dataclass
class Rehearsal:
    experiment: str
    gpus: int
    layout: str
    layers: int  # decoder layers rehearsed
    total_layers: int
    steps: int
    peak: Peak  # with the omitted layers' bytes added
    host_bytes: int  # parked layer inputs at their most (scaled to all layers)
    plan: Plan | None  # the planner's Plan for the same run
    wall_s: float
    notes: list[str]

    @property
    def difference(self) -> float:
        """(rehearsal - planner) / rehearsal; for a rehearsal with a `plan`."""
        assert self.plan is not None, "no planner figure to compare with"
        return (self.peak.total - self.plan.peak_gpu_bytes) / self.peak.total


class _WhereTracker(FSDPMemTracker):
    """`FSDPMemTracker` that also keeps the highest total seen in each (phase, innermost module)."""

    def __init__(self, model: nn.Module, optimizer, device: torch.device) -> None:
        super().__init__(mod=model, optm=optimizer)
        self.where_device, self.in_optimizer = device, False
        self.where_peaks: dict[tuple[str, str], dict[str, int]] = {}  # (phase, module) -> the snapshot at its peak
        self.where_entered: list[str | None] = []  # modules in the order their forward or backward began

        # ModTracker's `parents` is a set, and in a backward with recompute it keeps modules whose
        # backward hooks never fire (their recomputed outputs take the gradient): the module an op runs
        # in is the one entered last (forward or backward) that is still among the parents
        self._mod_tracker.register_user_hooks(pre_fw_hook=lambda module, _: self._entered(module),
                                              pre_bw_hook=lambda module, _: self._entered(module))

    def _entered(self, module: nn.Module) -> None:
        self.where_entered.append(self._mod_tracker.get_known_fqn(module))
        if len(self.where_entered) > 4096:
            del self.where_entered[:2048]

    def _innermost(self) -> str:
        parents = self._mod_tracker.parents
        for name in reversed(self.where_entered):
            if name in parents:
                return name
        return max(parents, key=lambda n: (n.count("."), len(n))) if parents else ""

    def _update_peak_stats(self, peak_state) -> None:
        # Replaces MemTracker's, which also walks every tracked module after every op (a third of
        # the rehearsal's time at 1M tokens): the peaks by (phase, module) below hold the same.
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                self._peak_mem[dev] = dev_snap["Total"]
                self._peak_mem_snap[dev] = deepcopy(dev_snap)
        snap = self._curr_mem_snap.get(self.where_device)
        if snap is None:
            return
        if self.in_optimizer:
            key = (OPTIMIZER, "")
        else:
            key = ("backward" if self._mod_tracker.is_bw else "forward", self._innermost())
        best = self.where_peaks.get(key)
        if best is None or snap["Total"] > best["Total"]:
            self.where_peaks[key] = deepcopy(snap)


def _fake_pg(gpus: int, rank: int):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers "fake"

    if dist.is_initialized():
        raise RuntimeError("rehearse: a process group is already initialised in this process")
    dist.init_process_group("fake", rank=rank, world_size=gpus, store=FakeStore())


def rehearse(cfg, gpus: int, routing: str = "busiest", layers: int | None = None, steps: int = 2,
             experiment: str = "", show_progress: bool | None = None, plan: Plan | None = None) -> Rehearsal:
    """Rehearse `cfg` on `gpus` fake ranks (see the module docstring); `routing` as `rehearse --routing`, `layers`
    as `_layers_to_run`. `plan`: the planner's Plan for a GPU (the rehearsal itself runs on the CPU)."""
    import torch.distributed as dist

    from genome_lm.model.contract import check_torch
    from genome_lm.model.patch import use_fake_values
    from genome_lm.model.presets import preset_config
    from genome_lm.parallel.mesh import check_layout, init_parallel
    from genome_lm.progress import progress
    from genome_lm.train.parallelize import parallelize, park_host_copies_on
    from genome_lm.train.trainer import build_model, compute_dtype

    check_torch()
    t_start = time.perf_counter()
    config = preset_config(cfg.model.name, **cfg.model.overrides)
    total_layers = config.num_hidden_layers
    mem = cfg.memory
    layers = _layers_to_run(cfg, config, layers)
    imbalance = plan.assume.expert_imbalance if plan is not None and routing == "busiest" else 1.0
    check_layout(cfg.parallel, gpus, config.n_routed_experts)
    _fake_pg(gpus, cfg.parallel.cp - 1)  # the last CP rank of replica 0: its DSA queries see the whole sequence
    try:
        par = init_parallel(cfg.parallel, torch.device("cpu"), sharded=True)
        par.fsdp_mesh, par.ep_mesh  # meshes are built before fake mode (they compute with real tensors)
        compute = compute_dtype(cfg)

        full = build_model(cfg, par.device, None, meta=True).model  # the real model's shards, for the omitted layers
        parallelize(full, mem, par, compute)
        # bytes this rank holds of the omitted layers' parameters once FSDP2 has sharded them
        omitted_bytes = sum(local.numel() * local.element_size() for p in full.model.layers[layers:].parameters()
                            for local in [p.to_local() if hasattr(p, "to_local") else p])
        del full
        run_cfg = cfg
        if layers < total_layers:  # the first `layers` decoder layers, per-layer lists cut
            run_cfg = cfg.model_copy(deep=True)
            cut = {k: getattr(config, k)[:layers] for k in ("layer_types", "indexer_types", "mlp_layer_types")}
            run_cfg.model.overrides = {**cfg.model.overrides, "num_hidden_layers": layers, **cut}
        model = build_model(run_cfg, par.device, None, meta=True).model
        parallelize(model, mem, par, compute)
        use_fake_values(model, imbalance)
        park_host_copies_on(model, "meta")

        passes = steps * layers * (2 if mem.recompute == "per-layer" else 1)
        bar = progress(passes, 0, f"rehearse {cfg.name or experiment}", "layer pass", disable=show_progress is False)
        for layer in model.model.layers:  # the model is dropped after the steps: its hooks with it
            layer.register_forward_pre_hook(lambda *_: bar.update(1))
        tracker, host = _fake_steps(model, cfg, par, config.vocab_size, steps)
        bar.close()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

    state_ratio = 2 * (2 if cfg.train.optimizer_state_dtype == "bfloat16" else 4) / 4  # two moments per float32 byte
    peak = _lift(tracker.where_peaks, omitted_bytes, state_ratio)
    offloaded_run, offloaded_all = layers - mem.offload_keep_last, total_layers - mem.offload_keep_last
    if layers < total_layers and offloaded_run > 0:
        host = host * offloaded_all // offloaded_run
    routed = f"busiest expert rank, {imbalance:g}x the mean rows" if imbalance > 1 else "uniform"
    notes = [f"routing: {routed} (fake tensors hold no router scores); DSA top-k: indices of the right shape, not "
             "chosen by scores",
             "KDA on fla's call contract with stand-ins for its kernels (allocations read from fla's source); "
             "CPU fake tensors: CUDA streams and pinned memory not exercised; padding checks skipped"]
    if layers < total_layers:
        notes.append(f"{layers} of {total_layers} decoder layers rehearsed; the other {total_layers - layers} added as "
                     f"their FSDP2 shards ({omitted_bytes / 2**30:.2f} GiB of float32 parameters on this rank), AdamW "
                     "state and gradients; host memory scaled by the offloaded layers")
    return Rehearsal(experiment, gpus, par.describe(), layers, total_layers, steps, peak, host, plan,
                     time.perf_counter() - t_start, notes)


def _layers_to_run(cfg, config, layers: int | None) -> int:
    """Decoder layers to rehearse: `layers` (GenomeLMError if the strategy cannot scale it up) or the fewest it can."""
    total_layers, mem = config.num_hidden_layers, cfg.memory
    reducible = mem.recompute == "per-layer" and mem.offload_layer_inputs
    if layers is None and reducible:  # the fewest first layers holding every kind of layer (attention x MLP x
        # indexer), and one more (the last layer keeps its input on the device with memory.offload_keep_last)
        kinds = list(zip(config.layer_types, config.mlp_layer_types, config.indexer_types))
        layers = min(len(kinds), max(kinds.index(kind) + 1 for kind in kinds) + 1)
    elif layers is None:
        layers = total_layers
    if not 1 <= layers <= total_layers:
        raise GenomeLMError(f"--layers {layers}: {cfg.model.name} has {total_layers} decoder layers; give 1 to "
                            f"{total_layers}, or all")
    if layers < total_layers and not reducible:
        raise GenomeLMError(f"--layers {layers}: fewer layers scale up only with memory.recompute: per-layer and "
                            "memory.offload_layer_inputs: true (then the omitted layers keep nothing on the device); "
                            "rehearse all layers (--layers all)")
    if layers < total_layers and mem.offload_keep_last >= layers:
        raise GenomeLMError(f"--layers {layers}: memory.offload_keep_last={mem.offload_keep_last} keeps as many "
                            "layers on the device; rehearse more layers")
    return layers


def _fake_steps(model, cfg, par, vocab_size: int, steps: int):
    """`steps` of the trainer's `train_step` on the parallelized meta `model` in fake tensors, under
    the memory tracker (the first step's peaks dropped: it has no optimizer state until its end);
    returns the tracker and the peak bytes parked on the host."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from genome_lm.train.optim import make_optimizer, make_scheduler
    from genome_lm.train.trainer import StepParts, train_step

    device = par.device
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device=device)
        model.train()
        optimizer = make_optimizer(model, cfg.train)
        scheduler = make_scheduler(optimizer, cfg.train)
        ids = torch.randint(0, vocab_size, (cfg.train.micro_batch, cfg.data.seq_len), device=device)
        batch = {"input_ids": ids, "labels": ids.clone()}
        parts = StepParts(par, model, optimizer, scheduler, cfg, None)
        tracker = _WhereTracker(model, optimizer, device)
        tracker.track_inputs((ids,))
        with tracker:
            for step in range(steps):
                train_step(parts, [batch] * cfg.train.grad_accum, lambda on: setattr(tracker, "in_optimizer", on))
                if step == 0:  # the first step has no optimizer state until its end
                    tracker.where_peaks.clear()
                    tracker.reset_mod_stats()
        host = tracker.get_tracker_snapshot("peak").get(torch.device("meta"), {}).get("Total", 0)
    return tracker, host


def _lift(peaks: dict, omitted: int, state_ratio: float) -> Peak:
    """The highest of the recorded peaks, each lifted by the omitted layers' bytes at that point (`omitted`
    float32 parameter bytes, as many gradient bytes, `state_ratio` x as many AdamW state bytes)."""
    lifted = []
    for (phase, module), snap in peaks.items():
        kinds = {getattr(k, "value", k): v for k, v in snap.items() if k != "Total"}  # the tracker's enums: str values
        kinds["Sharded Param"] = kinds.get("Sharded Param", 0) + omitted
        kinds["OptState"] = kinds.get("OptState", 0) + int(omitted * state_ratio)
        # the optimizer's temporaries are per tensor (train/optim.py): not scaled
        if phase == OPTIMIZER or (phase == "backward" and ".layers." in f".{module}"):
            kinds["Sharded Grad"] = kinds.get("Sharded Grad", 0) + omitted
        lifted.append(Peak(phase, module, kinds))
    if not lifted:
        raise RuntimeError("rehearse: the memory tracker recorded nothing")
    return max(lifted, key=lambda p: p.total)


def format_rehearsal(r: Rehearsal) -> str:
    """The report of a rehearsal with its planner's `plan`, side by side."""
    GiB, plan = 2**30, r.plan
    assert plan is not None, "the report compares with the planner"
    lines = [f"rehearsal: {r.experiment} on {r.gpus} fake ranks (one simulated: {r.layout}), {r.steps} training steps "
             f"under FSDPMemTracker, {r.layers} of {r.total_layers} decoder layers run; {r.wall_s:,.0f} s",
             f"peak per GPU: rehearsal {r.peak.total / GiB:.2f} GiB at {r.peak.phase} of {r.peak.module or 'the step'}",
             f"              planner   {plan.peak_gpu_bytes / GiB:.2f} GiB at {plan.memory.peak_where}",
             f"              difference {r.difference:+.1%} of the rehearsal's peak",
             "", f"  {'by kind (GiB)':52} {'rehearsal':>10} {'planner':>10}"]
    for name, (kinds, planned) in KINDS.items():
        ours = sum(r.peak.kinds.get(k, 0) for k in kinds)
        theirs = sum(plan.memory.breakdown.get(k, 0) for k in planned)
        lines.append(f"  {name:52} {ours / GiB:10.2f} {theirs / GiB:10.2f}")
    lines += ["  tracker kinds: " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in r.peak.kinds.items() if v),
              "  planner parts: " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in plan.memory.breakdown.items() if v),
              "", f"host memory held by offloaded layer inputs: rehearsal {r.host_bytes / GiB:.2f} GiB, planner "
              f"{plan.host_bytes_per_gpu / GiB:.2f} GiB (pinned, powers of two)", "", "assumed, not measured:"]
    lines += [f"  - {n}" for n in r.notes]
    lines.append("  - not covered on a real GPU: kernel scratch and speed, NCCL buffers, allocator fragmentation "
                 "and the CUDA context (the planner's margins)")
    return "\n".join(lines)
