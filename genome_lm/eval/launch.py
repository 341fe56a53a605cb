"""`genome-lm eval --nproc N | --ray [ADDRESS]`: eval as a `Job` of `genome_lm.parallel.launch`; every
worker runs `evaluate(cfg)`, which lays the ranks out as `--cp` says (`eval/sharded.py`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from genome_lm.eval.cache import cache_dir_for
from genome_lm.eval.config import EvalConfig
from genome_lm.eval.outputs import load_summary
from genome_lm.eval.run import check_inputs, evaluate
from genome_lm.eval.sharded import check_engine, layout
from genome_lm.outputs import holding
from genome_lm.parallel.launch import Job, WorkerContext, run_local, run_ray


def worker(cfg_json: dict, device=None, worker: WorkerContext | None = None) -> dict:
    """Every process of a distributed eval (module level: the launchers pickle it)."""
    return evaluate(EvalConfig(**cfg_json), device=device, attempt=worker.attempt if worker else 0)


def launch(cfg: EvalConfig, nproc: int | None, ray: str | None | bool = None, max_restarts: int = 0) -> dict:
    """Run the eval `cfg` on `nproc` local processes, or under Ray (`ray`: an address, "" or True
    for a local instance), restarting the workers up to `max_restarts` times (a restart scores only
    the windows the cache lacks); return the summary rank 0 wrote. The launch's Ray files and error
    messages go to a hidden directory beside --out (removed afterwards)."""
    check_engine(cfg)  # one-line errors before any process starts
    if nproc is not None:
        layout(cfg.cp, nproc)
    if not cfg.out:
        check_inputs(cfg)  # refuses it
    assert cfg.out is not None
    out = Path(cfg.out)
    with holding(cfg.out, "eval"):  # the workers' rank 0 works under this lock (outputs.HOLDER_ENV)
        check_inputs(cfg)
        job = Job(fn=worker, args=(cfg.model_dump(mode="json"),), layout=lambda world: layout(cfg.cp, world),
                  describe=f"eval: cp={cfg.cp}, dp=processes/cp",
                  keeps=f"Windows scored so far are kept in {cache_dir_for(out)}; rerun the same command to continue",
                  work_dir=out.parent / f".{out.name}.launch", name=f"eval-{out.name}")
        run_job(job, nproc, ray, max_restarts)
        return load_summary(cfg.out)


def run_job(job: Job, nproc: int | None, ray: str | None | bool, max_restarts: int = 0) -> None:
    """Run `job` as `launch` runs an eval's; its work folder is removed afterwards."""
    try:
        if ray is None:
            run_local(job, nproc or 1, max_restarts)
        else:
            run_ray(job, address=ray if isinstance(ray, str) and ray else None, nproc=nproc, max_restarts=max_restarts)
    finally:
        shutil.rmtree(job.work_dir, ignore_errors=True)
