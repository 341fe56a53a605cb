"""`genome-lm train --nproc N | --ray [ADDRESS]`: training as a `Job` of `genome_lm.parallel.launch`.

    run_local(train_job(cfg, out, resume), nproc, max_restarts)      # genome-lm train EXP --nproc 8
    run_ray(train_job(cfg, out, resume), address, nproc, max_restarts)   # genome-lm train EXP --ray [ADDRESS]

Every worker runs `genome_lm.train.train(cfg, out, resume)`, which joins the process group the
launcher prepared and lays the ranks out as `parallel: {cp, dp}` says (`mesh.init_parallel`).
"""

from __future__ import annotations

from pathlib import Path

from genome_lm.parallel.launch import Job, WorkerContext


def _train(cfg_json: dict, out: str | None, resume: bool, device=None, worker: WorkerContext | None = None) -> dict:
    """Every worker of a training launch. After a restart (attempt 1, 2, ...) the run resumes from
    its newest complete checkpoint: the first attempt passed the run directory's checks, or ended
    with a user error that the launcher raises again instead of retrying."""
    from genome_lm.config import parse_experiment
    from genome_lm.train.trainer import train

    worker = worker or WorkerContext()
    return train(parse_experiment(cfg_json), out=out, resume=resume or worker.attempt > 0, device=device,
                 worker=worker)


def train_job(cfg, out: str | None = None, resume: bool = False) -> Job:
    """`genome-lm train` as a Job: run directory `out` (default runs/NAME)."""
    from genome_lm.parallel.layout import resolve_layout

    par = cfg.parallel
    return Job(
        fn=_train, args=(cfg.model_dump(mode="json"), out, resume),
        layout=lambda world: resolve_layout(par.cp, par.dp, world),
        describe=f"parallel: cp={par.cp}, dp={par.dp}",
        keeps="Checkpoints written so far are kept; rerun with --resume to continue from the newest",
        work_dir=Path(out) if out else Path("runs") / (cfg.name or "run"), name=cfg.name or "run",
        default_workers=par.cp * int(par.dp) if par.dp != "auto" else None,
        workers_hint=" (or set parallel.dp to a number)", timeout_s=par.timeout,
    )

