"""`genome-lm train`: one process, or one rank of a distributed launch (docs/train.md, docs/parallel.md):
`train` runs `start_run`, then `run_step` per step (its `train_step` is the rehearsal's too)."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from genome_lm.config import ExperimentConfig, parse_experiment
from genome_lm.errors import EXIT_PREEMPTED, GenomeLMError, Preempted
from genome_lm.genome.shards import load_manifest
from genome_lm.model import build, expert_load, token_lut
from genome_lm.model.build import BuiltModel
from genome_lm.model.cp import all_reduce_sum
from genome_lm.model.ops.loss import IGNORE_INDEX
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.patch import has_values
from genome_lm.model.presets import META_ONLY, PRESETS
from genome_lm.model.weights.reader import load_weights_
from genome_lm.parallel import callbacks, clip_grad_norm_
from genome_lm.parallel.launch import Job, WorkerContext
from genome_lm.parallel.mesh import ParallelContext, init_parallel, resolve_layout
from genome_lm.progress import Bar, progress
from genome_lm.settings import set_tf32
from genome_lm.train.checkpoint import CheckpointManager, RunDir, check_run_dir, latest_checkpoint, resolve_model_dir
from genome_lm.train.data import SequenceStream
from genome_lm.train.guard import Preemption, Watchdog
from genome_lm.train.metrics import MetricsLog, PeakMemory
from genome_lm.train.optim import make_optimizer, make_scheduler
from genome_lm.train.parallelize import host_bytes, parallelize

log = logging.getLogger(__name__)


def check_data(cfg: ExperimentConfig) -> dict:
    """The shards' manifest, once it has data.split and windows of at least data.seq_len tokens."""
    manifest = load_manifest(cfg.data.shards)
    if cfg.data.split not in manifest["splits"]:
        raise GenomeLMError(f"data.split: {cfg.data.shards} has no {cfg.data.split!r} split "
                            f"(it has {', '.join(manifest['splits'])})")
    if cfg.data.split == "eval":
        log.warning("data.split=eval: training on the held-out chromosomes (%s); evals of this run on them measure "
                    "what it memorised, not what it generalises", ", ".join(manifest["splits"]["eval"]["chroms"]))
    if (window := manifest.get("parameters", {}).get("seq_len")) and cfg.data.seq_len > window:
        raise GenomeLMError(f"data.seq_len={cfg.data.seq_len:,} is longer than the windows of {cfg.data.shards} "
                            f"({window:,} tokens), so no sequence could have that context; prepare shards with "
                            f"--seq-len {cfg.data.seq_len} or longer, or lower data.seq_len")
    return manifest


def resolve_init(cfg: ExperimentConfig, dry: bool = False) -> str | None:
    """model.init with ${VAR}s expanded; an unset one is an error (a dry run warns, checks model.name only)."""
    if not cfg.model.init:
        return None
    init = os.path.expandvars(cfg.model.init)
    if "$" in init:
        msg = (f"model.init {cfg.model.init!r}: environment variable not set; export it to the checkpoint "
               "directory (e.g. your download of zai-org/GLM-5.3-Flash) or --set model.init=DIR")
        if not dry:
            raise GenomeLMError(msg)
        log.warning("%s; the dry run checks the %s architecture only", msg, cfg.model.name)
        return None
    if not Path(init).exists():
        raise GenomeLMError(f"model.init: {init} does not exist; point it to a checkpoint directory "
                            "(e.g. runs/demo_base/checkpoints/last)")
    return init


def build_model(cfg: ExperimentConfig, device: torch.device, init: str | None, meta: bool = False) -> BuiltModel:
    """The single-device model (seeded with train.seed), then the weights of `init`; structure only with `meta`."""
    torch.manual_seed(cfg.train.seed)
    built = build(cfg.model.name, dtype=cfg.model.dtype, device=None if meta else device, meta=meta,
                  **cfg.model.overrides)
    if init and not meta:
        load_weights_(built.model, resolve_model_dir(init), dtype=built.dtype)
        log.info("initialised weights from %s", init)
    return built


def compute_dtype(cfg: ExperimentConfig) -> torch.dtype | None:
    """bf16 for a bf16 model (float32 master weights under FSDP2), None (the parameters' own) for float32."""
    return torch.bfloat16 if cfg.model.dtype == "bfloat16" else None


def build_parallel_model(cfg: ExperimentConfig, par: ParallelContext, init: str | None):
    """The model built, then `parallelize`d. Distributed: on the meta device, then each rank fills only its
    shards, from the weights directory or the preset built in full on CPU with one process's seed (the same
    weights on every rank; not for glm53-flash)."""
    compute = compute_dtype(cfg)
    if not par.distributed:
        return parallelize(build_model(cfg, par.device, init).model, cfg.memory, par, compute)
    built = build_model(cfg, par.device, None, meta=True)
    model = built.model
    parallelize(model, cfg.memory, par, compute)
    weights = resolve_model_dir(init or cfg.model.name) if init or cfg.model.name not in PRESETS else None
    if weights is None and cfg.model.name in META_ONLY:
        raise GenomeLMError(f"model.init: training {cfg.model.name} from scratch would build the whole model on "
                            "every rank's CPU first; set model.init to its checkpoint directory")
    load_weights_(model, weights or build_model(cfg, torch.device("cpu"), None).model.state_dict(), par.device,
                  dtype=built.dtype)
    log.info("rank %d: materialised its shards from %s", par.rank, weights or "the preset initialisation")
    return model


def model_token_map(cfg: ExperimentConfig, manifest: dict, vocab_size: int, init: str | None) -> np.ndarray:
    lut = token_lut(manifest["vocab"], resolve_model_dir(init) if init else cfg.model.name)
    if int(lut.max()) >= vocab_size:
        raise GenomeLMError(f"model: token id {int(lut.max())} does not fit the model vocabulary ({vocab_size})")
    return lut


def make_stream(cfg: ExperimentConfig, lut: np.ndarray) -> SequenceStream:
    d = cfg.data
    return SequenceStream(d.shards, d.split, d.seq_len, seed=d.seed, reverse_complement=d.reverse_complement,
                          min_piece=d.min_piece, ignore_n=d.ignore_n, token_map=lut)


class ExpertBalancer:
    """Auxiliary-loss-free expert balancing (DeepSeek-V3 §2.1.2; docs/train.md, "Expert balancing"): sums
    `last_expert_counts` of patched MoE layers over a step, then moves each router's `e_score_correction_bias` by

        bias_e += rate * sign(mean_load - load_e)

    with `load_e` the tokens routed to expert e in the step over every micro-batch and rank (so the bias stays
    identical on all ranks). With EP also `rank_imbalance` (the busiest expert rank's tokens over the mean, in the
    worst layer). Rate 0, no EP: idle."""

    def __init__(self, model: torch.nn.Module, rate: float, ep: int = 1):
        self.rate, self.ep = float(rate), ep
        self.rank_imbalance: float | None = None
        self.layers = [m for m in model.modules() if isinstance(m, BlockedGlm5NextTextMoE)]
        self._counts: list[torch.Tensor | None] = [None] * len(self.layers)
        self.active = (self.rate > 0 or ep > 1) and bool(self.layers)

    def accumulate(self) -> None:
        """Add each layer's counts from the forward just run (once per micro-batch)."""
        if not self.active:
            return
        for i, m in enumerate(self.layers):
            if m.last_expert_counts is not None:
                c, before = m.last_expert_counts.detach(), self._counts[i]
                self._counts[i] = c if before is None else before + c

    @torch.no_grad()
    def step(self, update: bool = True) -> float | None:
        """Move every router's bias by the step's loads over all ranks (not for a skipped step), reset the
        counts; the largest |bias| afterwards, or None when balancing is off."""
        if not self.active:
            return None
        counts, self._counts = self._counts, [None] * len(self.layers)
        present = [(i, c) for i, c in enumerate(counts) if c is not None]  # (layer, counts) of the layers that ran
        loads = all_reduce_sum(torch.stack([c for _, c in present]).double()) if present else None  # [L, E]
        if self.ep > 1 and loads is not None:
            per_rank = loads.view(len(present), self.ep, -1).sum(-1)  # [L, ep]: tokens each expert rank computed
            ratio = (per_rank.max(1).values / per_rank.mean(1).clamp_min(1e-9)).max()
            self.rank_imbalance = float(ratio) if has_values(ratio) else None  # none on fake tensors
        if self.rate == 0:
            return None
        if update and loads is not None:
            delta = self.rate * torch.sign(loads.mean(dim=1, keepdim=True) - loads)
            for row, (i, _) in enumerate(present):
                bias = self.layers[i].gate.e_score_correction_bias
                bias.add_(delta[row].to(bias.dtype))
        largest = torch.stack([m.gate.e_score_correction_bias.abs().max() for m in self.layers]).max()
        return float(largest) if has_values(largest) else None


@dataclass
class StepParts:
    """What `train_step` works on: the trainer's `Run`, or the rehearsal's fake-tensor model (no checkpoints)."""

    par: ParallelContext
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    cfg: ExperimentConfig
    checkpoints: CheckpointManager | None

    def __post_init__(self) -> None:
        self.balancer = ExpertBalancer(self.model, self.cfg.train.moe_bias_update_rate, self.par.ep)
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # the trained ones
        self.clip = self.cfg.train.grad_clip if self.cfg.train.grad_clip is not None else math.inf


@dataclass
class Run(StepParts):
    """What the loop works with, built once by `start_run`."""

    checkpoints: CheckpointManager
    rd: RunDir
    stream: SequenceStream
    metrics: MetricsLog | None  # rank 0's
    start: int  # the step resumed from (0: a fresh run)
    memory: PeakMemory
    bar: Bar
    worker: WorkerContext  # what the launcher told this process (attempt, restarts, files)
    unlogged: dict = field(default_factory=dict)  # checkpoint writes completed at steps not logged


def start_run(cfg: ExperimentConfig, par: ParallelContext, run_dir: Path, resume: bool,
              show_progress: bool | None, worker: WorkerContext) -> Run:
    """Check the data and run directory, build model, data and optimizer, resume, record the run."""
    if par.device.type == "cuda":
        set_tf32(cfg.train.tf32)
    manifest = check_data(cfg)
    if cfg.train.warmup_steps > cfg.train.steps and par.is_main:
        log.warning("train.warmup_steps=%d is more than train.steps=%d: the learning rate stops at %d/%d of "
                    "train.lr, still warming up", cfg.train.warmup_steps, cfg.train.steps, cfg.train.steps,
                    cfg.train.warmup_steps)
    rd = par.on_main(lambda: check_run_dir(run_dir, resume, cfg, par.dp))
    init = resolve_init(cfg)
    model = build_parallel_model(cfg, par, init)
    model.train()
    stream = make_stream(cfg, model_token_map(cfg, manifest, model.config.vocab_size, init))
    optimizer = make_optimizer(model, cfg.train)
    scheduler = make_scheduler(optimizer, cfg.train)
    checkpoints = CheckpointManager(run_dir / "checkpoints", par, cfg.train.checkpoint_mode,
                                    cfg.train.keep_checkpoints, cfg.train.on_disk_full, tokenizer_from=cfg.model.name)
    start = 0  # the step to start after: that of the newest checkpoint that loads, when resuming
    if rd.latest is None:
        torch.manual_seed(cfg.train.seed)
    else:
        start, latest = checkpoints.load_newest(model, optimizer, scheduler, stream)
        log.info("resumed from %s (step %d)", latest, start)
        if start >= cfg.train.steps:
            log.warning("--resume: %s is at step %d and train.steps is %d: nothing to train; raise train.steps "
                        "(e.g. --set train.steps=%d) to continue it", run_dir, start, cfg.train.steps,
                        start + cfg.train.steps)
    par.on_main(lambda: rd.write(cfg))
    metrics = MetricsLog(run_dir, cfg.log.wandb, cfg.log.project, cfg.name or run_dir.name,
                         cfg.model_dump(mode="json"), resume_step=start) if par.is_main else None
    return Run(par, model, optimizer, scheduler, cfg, checkpoints, rd=rd, stream=stream, metrics=metrics, start=start,
               memory=PeakMemory(par.device), bar=progress(cfg.train.steps, start, f"train {cfg.name}", "step",
                                                           disable=not par.is_main or show_progress is False),
               worker=worker)


def _value(t: torch.Tensor, fake: float) -> float:
    """The value of the 0-dim `t`; `fake` for a fake tensor (the rehearsal's), which holds none."""
    return float(t) if has_values(t) else fake


def train_step(parts: StepParts, batches: list[dict], optimizer_phase: Callable[[bool], None] = lambda _: None) -> dict:
    """The training step (the trainer's and the rehearsal's): forward and backward of each micro-batch (its
    loss weighted by its share of the global batch's targets), clipping, the optimizer and scheduler step
    when loss and norm are finite, zero_grad, the expert balancer. Fake tensors: targets count as the labels'
    size, loss and norm as 0. `optimizer_phase(True)` / `(False)` bracket clipping to zero_grad."""
    par = parts.par
    n_targets = [int(_value((b["labels"][:, 1:] != IGNORE_INDEX).sum(), b["labels"][:, 1:].numel())) for b in batches]
    total_targets = max(1, int(par.sum_dp(sum(n_targets))[0]))  # over all replicas
    loss_sum = 0.0
    for batch, n in zip(batches, n_targets):
        out = parts.model(**batch)
        (out.loss * (n / total_targets)).backward()
        parts.balancer.accumulate()
        loss_sum += _value(out.loss.detach(), 0.0) * n
        del out
    seq_tokens = int(par.max_all(max(int(b["input_ids"].shape[1]) for b in batches)))  # longest sequence
    loss_sum, tokens = par.sum_dp(loss_sum, sum(int(b["input_ids"].numel()) for b in batches))
    loss = loss_sum / total_targets
    optimizer_phase(True)
    grad_norm = _value(clip_grad_norm_(parts.params, parts.clip), 0.0)
    lr = parts.scheduler.get_last_lr()[0]
    finite = math.isfinite(loss) and math.isfinite(grad_norm)
    if finite:
        if parts.checkpoints is not None:
            parts.checkpoints.staged()  # the staged copy of a checkpoint in flight is complete before the update
        parts.optimizer.step()
        parts.scheduler.step()
    parts.optimizer.zero_grad(set_to_none=True)
    optimizer_phase(False)
    bias_max = parts.balancer.step(update=finite)
    if par.device.type == "cuda":
        torch.cuda.synchronize(par.device)
    return {"loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": int(tokens), "seq_tokens": seq_tokens,
            "finite": finite, "bias_max": bias_max}


def step_record(run: Run, step: int, done: dict, elapsed: float) -> dict:
    """The metrics.jsonl record of a step: `train_step`'s numbers and its time (the slowest rank's)."""
    par = run.par
    record = {
        "step": step, "loss": done["loss"], "lr": done["lr"], "grad_norm": done["grad_norm"],
        "tokens": done["tokens"], "seq_tokens": done["seq_tokens"], "tokens_per_s": done["tokens"] / elapsed,
        "step_time_s": elapsed, "peak_mem_bytes": int(par.max_all(run.memory.peak())), "epoch": run.stream.epoch,
    }
    if run.cfg.memory.offload_layer_inputs:  # pinned host memory the parked layer inputs held
        record["offload_host_peak_bytes"] = int(par.max_all(host_bytes(reset_peak=True)[1]))
    if par.distributed:
        record["world_size"] = par.world
    if load := expert_load(run.model):
        imb = [v["imbalance"] for v in load.values()]
        record["moe_imbalance_max"] = max(imb)
        record["moe_imbalance_mean"] = sum(imb) / len(imb)
    optional = {"moe_bias_max_abs": done["bias_max"], "ep_rank_imbalance": run.balancer.rank_imbalance}
    record.update({k: v for k, v in optional.items() if v is not None})
    return record


def run_step(run: Run, step: int, stop: Preemption, dog: Watchdog) -> dict:
    """Train, record, agree on a preemption, checkpoint, log, step callbacks; `Preempted` after its checkpoint."""
    cfg, par = run.cfg, run.par
    dog.begin(step)
    run.memory.reset()
    t0 = time.perf_counter()
    batches = (run.stream.next_batch(cfg.train.micro_batch, par.dp_rank, par.dp) for _ in range(cfg.train.grad_accum))
    done = train_step(run, [{k: v.to(par.device) for k, v in b.items()} for b in batches])  # all CP ranks: the same
    elapsed = par.max_all(time.perf_counter() - t0)
    record = {**step_record(run, step, done, elapsed), **run.unlogged, **run.checkpoints.poll()}
    if not done["finite"]:  # not applied: stop (train.on_nonfinite) or warn
        loss, grad_norm = done["loss"], done["grad_norm"]
        record["skipped"] = True
        if cfg.train.on_nonfinite == "stop":
            if run.metrics is not None:
                run.metrics.write(record)
            run.checkpoints.wait()
            raise GenomeLMError(
                f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at step {step} "
                f"(loss {loss}, grad norm {grad_norm}); stopped without updating the weights. Last good "
                f"checkpoint: {latest_checkpoint(run.checkpoints.ckpt_dir) or 'none'}. Lower train.lr, check the "
                "data, or set train.on_nonfinite: skip"
            )
        log.warning("step %d: non-finite loss/gradient (loss %s, grad norm %s); step skipped", step, loss, grad_norm)
    dog.end(step, elapsed)
    preempted = par.max_all(1.0 if stop.requested() else 0.0) > 0  # collective: any rank that wants to stop
    if step % cfg.train.checkpoint_every == 0 or step == cfg.train.steps or preempted:
        with dog.paused():
            export = cfg.train.export_model is True or (cfg.train.export_model == "last" and step == cfg.train.steps)
            info = {"loss": done["loss"], "experiment": cfg.name, "world_size": par.world, "dp": par.dp, "cp": par.cp,
                    "ep": par.ep, "model_exported": export}
            record.update(run.checkpoints.save(step, run.model, run.optimizer, run.scheduler, run.stream, info, export,
                                               compute_dtype(cfg), wait=preempted or step == cfg.train.steps))
    logged = step % cfg.log.every == 0 or step == cfg.train.steps or not done["finite"] or preempted
    if logged and run.metrics is not None:
        run.metrics.write(record)
    written = ("checkpoint_write_s", "checkpoint_written_step")  # what the resume decision reads: in a logged record
    run.unlogged = {} if logged else {k: record[k] for k in written if k in record}
    run.bar.update(1)
    run.bar.set_postfix(loss=f"{done['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
    callbacks.after_step(step, par.rank, run.worker.attempt)
    if preempted:
        why = stop.requested() or "a preemption signal on another rank"
        raise Preempted(f"stopped on {why} at step {step}: checkpoint "
                        f"{run.checkpoints.ckpt_dir / f'step_{step:08d}'} is complete (exit code {EXIT_PREEMPTED})")
    return record


def train(cfg: ExperimentConfig, out: str | Path | None = None, resume: bool = False,
          device: torch.device | None = None, show_progress: bool | None = None,
          worker: WorkerContext | None = None) -> dict:
    """Train `cfg` into the run directory `out` (default runs/NAME); return the last metrics."""
    par = init_parallel(cfg.parallel, device, sharded=compute_dtype(cfg) is not None)
    run_dir = Path(out) if out else Path("runs") / (cfg.name or "run")
    worker = worker or WorkerContext()
    stop = Preemption(cfg.train.preempt_signals, worker)
    try:
        run = start_run(cfg, par, run_dir, resume, show_progress, worker)
    except BaseException:
        stop.restore()
        raise
    dog = Watchdog(par, cfg.parallel.watchdog_factor, cfg.parallel.watchdog_min_s, worker)
    record, outcome = {}, "crashed"
    try:
        for step in range(run.start + 1, cfg.train.steps + 1):
            record = run_step(run, step, stop, dog)
        outcome = "done"
    except (GenomeLMError, Preempted):
        outcome = "stopped"
        raise
    finally:  # the save in flight completes unless the run crashed
        dog.close()
        stop.restore()
        try:
            run.checkpoints.close(finish=outcome != "crashed")
        finally:
            run.bar.close()
            if run.metrics is not None:
                run.metrics.close()
            run.par.shutdown()
            restarted = outcome == "crashed" and run.worker.max_restarts > run.worker.attempt  # kept for a restart
            if outcome != "done" and run.par.is_main and not restarted:
                run.rd.discard_unstarted()  # a new run that stopped before its first checkpoint leaves nothing
    if record:
        log.info("finished %s: step %d, loss %.4f; checkpoints in %s", cfg.name, record["step"], record["loss"],
                 run.checkpoints.ckpt_dir)
    return record


def _worker(cfg_json: dict, out: str | None, resume: bool, device, worker: WorkerContext) -> dict:
    """Every worker of a training launch; after a restart the run resumes from its newest checkpoint."""
    return train(parse_experiment(cfg_json), out=out, resume=resume or worker.attempt > 0, device=device,
                 worker=worker)


def train_job(cfg, out: str | None = None, resume: bool = False) -> Job:
    """`genome-lm train --nproc N | --ray [ADDRESS]` as a Job: run directory `out` (default runs/NAME)."""
    par = cfg.parallel
    return Job(
        fn=_worker, args=(cfg.model_dump(mode="json"), out, resume),
        layout=lambda world: resolve_layout(par.cp, par.dp, world),
        describe=f"parallel: cp={par.cp}, dp={par.dp}",
        keeps="Checkpoints written so far are kept; rerun with --resume to continue from the newest",
        work_dir=Path(out) if out else Path("runs") / (cfg.name or "run"), name=cfg.name or "run",
        default_workers=par.cp * int(par.dp) if par.dp != "auto" else None,
        workers_hint=" (or set parallel.dp to a number)", timeout_s=par.timeout,
    )

