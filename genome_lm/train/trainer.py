"""`genome-lm train`: one process (CPU or one GPU), or one rank of a distributed launch. The
loop reads top to bottom:

    layout -> build model -> parallelize (long-context ops, CP, recompute, offload, FSDP) -> data
    -> optimizer -> [resume] -> for each step: micro-batches, backward, clip, check finite, step,
    log, checkpoint.

Building (`build_parallel_model`): one process builds the model whole; a distributed run never
materialises it on a rank: meta device, parallelize, then each rank fills only its FSDP2 shards.

Distributed (`--nproc` / `--ray`): every rank runs this same function; each dp replica reads its
own part of every global batch and the loss is normalised by the global number of scored tokens,
so loss and gradients equal one process reading the whole batch (docs/parallel.md).

Run directory `RUN/`: `config.yaml` (resolved), `metrics.jsonl` (one object per optimizer
step), `checkpoints/` (see `checkpoint.py`), `wandb/` (offline by default).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from genome_lm.config import ExperimentConfig, dump_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.genome.shards import load_manifest
from genome_lm.model.ops.loss import IGNORE_INDEX
from genome_lm.model.weights import load_weights_
from genome_lm.outputs import read_marker, what_it_is, write_marker
from genome_lm.parallel.fsdp import clip_grad_norm
from genome_lm.parallel.launch import maybe_inject_fault
from genome_lm.parallel.mesh import ParallelContext, init_parallel
from genome_lm.progress import progress
from genome_lm.train.checkpoint import (
    clean_partials,
    latest_checkpoint,
    load_newest_whole,
    resolve_model_dir,
    save_checkpoint,
)
from genome_lm.train.data import SequenceStream
from genome_lm.train.memory import host_bytes
from genome_lm.train.metrics import MetricsLog, NullMetrics, PeakMemory, logged_steps
from genome_lm.train.parallelize import parallelize
from genome_lm.train.resume import accept_resume, record_resume
from genome_lm.train.schedule import make_optimizer, make_scheduler
from genome_lm.utils import read_yaml, set_tf32

log = logging.getLogger(__name__)


def check_data(cfg: ExperimentConfig) -> dict:
    """The shards' manifest, once data.split exists in it and its windows are at least data.seq_len
    long (a longer data.seq_len would train shorter sequences than asked)."""
    manifest = load_manifest(cfg.data.shards)
    if cfg.data.split not in manifest["splits"]:
        raise GenomeLMError(f"data.split: {cfg.data.shards} has no {cfg.data.split!r} split "
                            f"(it has {', '.join(manifest['splits'])})")
    if cfg.data.split == "eval":
        log.warning("data.split=eval: training on the held-out chromosomes (%s); evals of this run on them measure "
                    "what it memorised, not what it generalises", ", ".join(manifest["splits"]["eval"]["chroms"]))
    window = manifest.get("parameters", {}).get("seq_len")
    if window and cfg.data.seq_len > window:
        raise GenomeLMError(f"data.seq_len={cfg.data.seq_len:,} is longer than the windows of {cfg.data.shards} "
                            f"({window:,} tokens), so no sequence could have that context; prepare shards with "
                            f"--seq-len {cfg.data.seq_len} or longer, or lower data.seq_len")
    return manifest


def resolve_init(cfg: ExperimentConfig, dry: bool = False) -> str | None:
    """model.init with ${VAR}s expanded. Unset variables are an error for training; a dry run
    warns and checks the architecture of model.name only."""
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


def build_model(cfg: ExperimentConfig, device: torch.device, init: str | None, meta: bool = False):
    """The single-device model: preset initialisation (seeded with train.seed) or the weights of
    model.name when it is a directory, then those of `init`; structure only with `meta`."""
    from genome_lm.model import build

    torch.manual_seed(cfg.train.seed)
    model = build(cfg.model.name, dtype=cfg.model.dtype, device=None if meta else device, meta=meta,
                  **cfg.model.overrides)
    if init and not meta:
        load_weights_(model, resolve_model_dir(init))
        log.info("initialised weights from %s", init)
    return model


def compute_dtype(cfg: ExperimentConfig) -> torch.dtype | None:
    """What training computes in: bf16 for a bf16 model (float32 master weights under FSDP2, see
    `genome_lm.parallel.fsdp`), None (the parameters' own dtype) for a float32 one."""
    return torch.bfloat16 if cfg.model.dtype == "bfloat16" else None


def build_parallel_model(cfg: ExperimentConfig, par: ParallelContext, init: str | None):
    """The model ready to train: built, then `parallelize`d. Distributed: built on the meta device,
    parallelized there (FSDP2 shards), then each rank allocates only its shards and fills them
    (`load_weights_`): from the weights directory, reading just its rows of each tensor; from
    scratch, as slices of the preset model built in full on CPU with the same seed as one process
    (so a distributed run starts from the same weights; not meant for glm53-flash)."""
    from genome_lm.model.presets import META_ONLY, is_preset

    compute = compute_dtype(cfg)
    if not par.distributed:
        return parallelize(build_model(cfg, par.device, init), cfg.memory, par, compute)
    model = build_model(cfg, par.device, None, meta=True)
    parallelize(model, cfg.memory, par, compute)
    weights = resolve_model_dir(init or cfg.model.name) if init or not is_preset(cfg.model.name) else None
    if weights is None and cfg.model.name in META_ONLY:
        raise GenomeLMError(f"model.init: training {cfg.model.name} from scratch would build the whole model on "
                            "every rank's CPU first; set model.init to its checkpoint directory")
    load_weights_(model, weights or build_model(cfg, torch.device("cpu"), None).state_dict(), par.device)
    log.info("rank %d: materialised its shards from %s", par.rank, weights or "the preset initialisation")
    return model


def model_token_map(cfg: ExperimentConfig, manifest: dict, vocab_size: int, init: str | None) -> np.ndarray:
    from genome_lm.model import token_lut

    lut = token_lut(manifest["vocab"], resolve_model_dir(init) if init else cfg.model.name)
    if int(lut.max()) >= vocab_size:
        raise GenomeLMError(f"model: token id {int(lut.max())} does not fit the model vocabulary ({vocab_size})")
    return lut


def make_stream(cfg: ExperimentConfig, lut: np.ndarray) -> SequenceStream:
    """The experiment's training sequences (`data:`), in model token ids through `lut`."""
    d = cfg.data
    return SequenceStream(d.shards, d.split, d.seq_len, seed=d.seed, reverse_complement=d.reverse_complement,
                          min_piece=d.min_piece, ignore_n=d.ignore_n, token_map=lut)


@dataclass
class RunDir:
    """What `check_run_dir` found: the checkpoint to resume from (None: a fresh run) and the changes a
    resume takes; `write_run_dir` records them once the run has started."""

    path: Path
    latest: Path | None
    accepted: list
    fresh: bool  # no marker yet: the folder is new (or empty), and is marked as a run when it starts
    existed: bool  # the folder was there before this run (empty, when fresh)
    sequences_per_step: int


def check_run_dir(run_dir: Path, resume: bool, cfg: ExperimentConfig, dp: int) -> RunDir:
    """Rank 0: refuse a folder that is not a run directory, clear half-written checkpoints, refuse a
    used run directory without --resume and a resume with changed settings (`resume.accept_resume`).
    Writes nothing but the removal of half-written checkpoints."""
    marker = read_marker(run_dir) if run_dir.is_dir() else None
    earlier_run = (run_dir / "config.yaml").is_file() or (run_dir / "checkpoints").is_dir()
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())) and (
            (marker is None and not earlier_run) or (marker is not None and marker["kind"] != "run")):
        raise GenomeLMError(f"--out {run_dir} is {what_it_is(run_dir)}, not a run directory; train writes into a new "
                            "folder or its own run directory: choose another --out")
    ckpt_dir = run_dir / "checkpoints"
    clean_partials(ckpt_dir)
    latest = latest_checkpoint(ckpt_dir)
    if latest is not None and not resume:
        raise GenomeLMError(f"{run_dir} already has checkpoints (newest {latest.name}); pass --resume to continue "
                            "it, or --out a new run directory")
    if resume and latest is None:
        check_never_checkpointed(run_dir)
        earlier = [f for f in ("metrics.jsonl", "config.yaml") if (run_dir / f).is_file()]
        log.warning("--resume: no checkpoint in %s; starting a fresh run from step 0%s", ckpt_dir,
                    f" ({' and '.join(earlier)} of the attempt without a checkpoint start over)" if earlier else "")
    per_step = cfg.train.micro_batch * cfg.train.grad_accum * dp  # sequences per optimizer step
    accepted = []
    if resume and latest is not None:  # refuses a changed data/model/optimizer key before anything is written
        accepted = accept_resume(run_dir, cfg, per_step, None if marker is None else marker.get("sequences_per_step"))
    return RunDir(run_dir, latest if resume else None, accepted, marker is None, run_dir.exists(), per_step)


def check_never_checkpointed(run_dir: Path) -> None:
    """A `--resume` that finds no checkpoint starts afresh only when the run never wrote one (an attempt
    stopped before its first): when metrics.jsonl records a step at which config.yaml's run saved one
    (a multiple of checkpoint_every, or its last step), its checkpoints were removed, and starting over
    would replace its history. Refused in one line."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return
    steps = [step for step, _ in logged_steps(path)[0]]
    try:
        train_cfg = read_yaml(run_dir / "config.yaml", "data, model, train, ...").get("train") or {}
        every, last = int(train_cfg.get("checkpoint_every", 0)), int(train_cfg.get("steps", 0))
    except (GenomeLMError, ValueError, TypeError, AttributeError):
        every, last = 1, 0  # no readable config: any logged step counts
    saved = [s for s in steps if (every and s % every == 0) or s == last]
    if saved:
        raise GenomeLMError(f"--resume: {run_dir} has no checkpoint, but its metrics.jsonl records step {max(saved)}, "
                            "where the run saved one: its checkpoints were removed, and starting over would replace "
                            "its history. Train into a new --out (or move metrics.jsonl away to start this run afresh)")


def discard_unstarted(rd: RunDir) -> None:
    """A new run that stopped before its first checkpoint holds nothing to resume: remove what it
    wrote (the folder too, unless it existed before, empty), saying so."""
    if not rd.fresh or rd.latest is not None or latest_checkpoint(rd.path / "checkpoints") is not None:
        return
    if rd.existed:
        for child in rd.path.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    else:
        shutil.rmtree(rd.path, ignore_errors=True)
    log.warning("%s: removed what the run wrote, as it stopped before its first checkpoint (nothing to resume)",
                rd.path)


def write_run_dir(rd: RunDir, cfg: ExperimentConfig) -> None:
    """Rank 0, once the model, the data and any checkpoint have loaded: mark the folder as a run and
    write config.yaml (a resume: `resume.record_resume`)."""
    rd.path.mkdir(parents=True, exist_ok=True)
    if rd.fresh:
        write_marker(rd.path, "run", [cfg.data.shards], sequences_per_step=rd.sequences_per_step)
    if rd.latest is not None:
        record_resume(rd.path, cfg, rd.accepted)
    else:
        (rd.path / "config.yaml").write_text(dump_experiment(cfg))


def _micro_batches(stream: SequenceStream, cfg: ExperimentConfig, par: ParallelContext) -> list[dict]:
    """This replica's micro-batches of the step (all CP ranks of a replica get the same)."""
    return [{k: v.to(par.device) for k, v in stream.next_batch(cfg.train.micro_batch, par.dp_rank, par.dp).items()}
            for _ in range(cfg.train.grad_accum)]


def train(cfg: ExperimentConfig, out: str | Path | None = None, resume: bool = False,
          device: torch.device | None = None, show_progress: bool | None = None) -> dict:
    """Train `cfg` into the run directory `out` (default runs/NAME); return the last metrics."""
    from genome_lm.model import expert_load
    from genome_lm.train.balance import ExpertBalancer

    par = init_parallel(cfg.parallel, device, sharded=compute_dtype(cfg) is not None)
    device = par.device
    if device.type == "cuda":
        set_tf32(cfg.train.tf32)
    run_dir = Path(out) if out else Path("runs") / (cfg.name or "run")
    manifest = check_data(cfg)
    if cfg.train.warmup_steps > cfg.train.steps and par.is_main:
        log.warning("train.warmup_steps=%d is more than train.steps=%d: the learning rate stops at %d/%d of "
                    "train.lr, still warming up", cfg.train.warmup_steps, cfg.train.steps, cfg.train.steps,
                    cfg.train.warmup_steps)

    rd = par.on_main(lambda: check_run_dir(run_dir, resume, cfg, par.dp))
    latest = rd.latest

    init = resolve_init(cfg)
    model = build_parallel_model(cfg, par, init)
    lut = model_token_map(cfg, manifest, model.config.vocab_size, init)
    model.train()
    stream = make_stream(cfg, lut)
    optimizer = make_optimizer(model, cfg.train)
    scheduler = make_scheduler(optimizer, cfg.train)
    start = 0
    if latest is not None:
        start, latest = load_newest_whole(run_dir / "checkpoints", model, optimizer, scheduler, stream)
        log.info("resumed from %s (step %d)", latest, start)
        if start >= cfg.train.steps:
            log.warning("--resume: %s is at step %d and train.steps is %d: nothing to train; raise train.steps "
                        "(e.g. --set train.steps=%d) to continue it", run_dir, start, cfg.train.steps,
                        start + cfg.train.steps)
    else:
        torch.manual_seed(cfg.train.seed)
    par.on_main(lambda: write_run_dir(rd, cfg))
    metrics = MetricsLog(run_dir, cfg.log.wandb, cfg.log.project, cfg.name or run_dir.name,
                         cfg.model_dump(mode="json"), resume_step=start) if par.is_main else NullMetrics()
    memory = PeakMemory(device)
    params = [p for p in model.parameters() if p.requires_grad]
    balancer = ExpertBalancer(model, cfg.train.moe_bias_update_rate, par.ep)
    clip = cfg.train.grad_clip if cfg.train.grad_clip is not None else math.inf
    bar = progress(cfg.train.steps, start, f"train {cfg.name}", "step",
                   disable=not par.is_main or show_progress is False)
    record: dict = {}
    failed = True
    try:
        for step in range(start + 1, cfg.train.steps + 1):
            memory.reset()
            t0 = time.perf_counter()
            batches = _micro_batches(stream, cfg, par)
            n_targets = [int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches]
            total_targets = max(1, int(par.sum_dp(sum(n_targets))[0]))  # over all replicas
            loss_sum = 0.0
            for batch, n in zip(batches, n_targets):
                out = model(**batch)
                (out.loss * (n / total_targets)).backward()
                balancer.accumulate()
                loss_sum += float(out.loss.detach()) * n
            tokens = sum(int(b["input_ids"].numel()) for b in batches)
            seq_tokens = int(par.max_all(max(int(b["input_ids"].shape[1]) for b in batches)))  # longest sequence
            loss_sum, tokens = par.sum_dp(loss_sum, tokens)
            loss, tokens = loss_sum / total_targets, int(tokens)
            grad_norm = clip_grad_norm(params, clip)
            lr = scheduler.get_last_lr()[0]
            finite = math.isfinite(loss) and math.isfinite(grad_norm)
            if finite:
                optimizer.step()
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            bias_max = balancer.step(update=finite)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = par.max_all(time.perf_counter() - t0)
            load = expert_load(model)
            record = {
                "step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": tokens,
                "seq_tokens": seq_tokens, "tokens_per_s": tokens / elapsed, "step_time_s": elapsed,
                "peak_mem_bytes": int(par.max_all(memory.peak())),
                "epoch": stream.epoch,
            }
            if cfg.memory.offload_layer_inputs:  # pinned host memory the parked layer inputs held
                record["offload_host_peak_bytes"] = int(par.max_all(host_bytes(reset_peak=True)[1]))
            if par.distributed:
                record["world_size"] = par.world
            if load:
                imb = [v["imbalance"] for v in load.values()]
                record["moe_imbalance_max"] = max(imb)
                record["moe_imbalance_mean"] = sum(imb) / len(imb)
            if bias_max is not None:
                record["moe_bias_max_abs"] = bias_max
            if balancer.rank_imbalance is not None:
                record["ep_rank_imbalance"] = balancer.rank_imbalance  # busiest expert rank / mean
            if not finite:
                record["skipped"] = True
                if cfg.train.on_nonfinite == "stop":
                    metrics.write(record)
                    last = latest_checkpoint(run_dir / "checkpoints")
                    raise GenomeLMError(
                        f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at step {step} "
                        f"(loss {loss}, grad norm {grad_norm}); stopped without updating the weights. Last good "
                        f"checkpoint: {last or 'none'}. Lower train.lr, check the data, or set "
                        "train.on_nonfinite: skip"
                    )
                log.warning("step %d: non-finite loss/gradient (loss %s, grad norm %s); step skipped",
                            step, loss, grad_norm)
            if step % cfg.log.every == 0 or step == cfg.train.steps or not finite:
                metrics.write(record)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
            if step % cfg.train.checkpoint_every == 0 or step == cfg.train.steps:
                export = cfg.train.export_model is True or (cfg.train.export_model == "last"
                                                            and step == cfg.train.steps)
                save_checkpoint(run_dir / "checkpoints", step, model, optimizer, scheduler, stream,
                                {"loss": loss, "experiment": cfg.name, "world_size": par.world, "dp": par.dp,
                                 "cp": par.cp, "ep": par.ep, "model_exported": export}, keep=cfg.train.keep_checkpoints,
                                parallel=par, export_model=export, export_dtype=compute_dtype(cfg))
            maybe_inject_fault(step, par.rank)
        failed = False
    finally:
        bar.close()
        metrics.close()
        par.shutdown()
        if failed and par.is_main:
            discard_unstarted(rd)
    if record:
        log.info("finished %s: step %d, loss %.4f; checkpoints in %s", cfg.name, record["step"], record["loss"],
                 run_dir / "checkpoints")
    return record

