"""`genome-lm score --nproc N | --ray [ADDRESS] [--cp C]`: score as a `Job` of `genome_lm.parallel.launch`.

Every worker runs `genome_lm.score.run.score(params)`: the model sharded by FSDP2 over the processes, one
region per dp replica at a time, each region in one forward split over its CP group of C processes; rank 0
writes (`score/run.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

from genome_lm.outputs import holding
from genome_lm.parallel.launch import Job, WorkerContext
from genome_lm.score.params import ScoreParams
from genome_lm.score.run import check_inputs, score


def worker(params: dict, device=None, worker: WorkerContext | None = None) -> dict:
    """Every process of a distributed score (module level: the launchers pickle it)."""
    return score(ScoreParams(**params), device=device)


def launch(p: ScoreParams, nproc: int | None, ray: str | None | bool = None) -> dict:
    """Run the score `p` on `nproc` local processes, or under Ray (`ray`: an address, "" or True for a local
    instance); return the summary rank 0 wrote."""
    from genome_lm.eval.launch import run_job
    from genome_lm.eval.sharded import layout
    from genome_lm.score.outputs import work_dir_for

    if nproc is not None:
        layout(p.cp, nproc)
    out = Path(p.out)
    with holding(out, "score"):  # the workers' rank 0 works under this lock (outputs.HOLDER_ENV)
        check_inputs(p)
        job = Job(fn=worker, args=(p.model_dump(mode="json"),), layout=lambda world: layout(p.cp, world),
                  describe=f"score: cp={p.cp}, dp=processes/cp",
                  keeps=f"Regions scored so far are kept in {work_dir_for(out)}; rerun the same command to continue",
                  work_dir=out.parent / f".{out.name}.launch", name=f"score-{out.name}")
        run_job(job, nproc, ray)
    return json.loads((out / "summary.json").read_text())
