"""Launching a `Job` (`genome-lm train`, `genome-lm eval`) on several processes (docs/parallel.md, Launching):

    run_local(job, nproc)              # --nproc N: torch elastic_launch, local c10d rendezvous, no restarts
    run_ray(job, address, nproc)       # --ray [ADDRESS]: Ray Train's TorchTrainer (none: a local instance)

A `Job` names the function every worker runs (`fn(*args, device=DEVICE)`, module level, so the
launcher can pickle it by reference; training's is in genome_lm.train.launch, eval's in
genome_lm.eval.sharded), how its layout fits a number of processes, and where its workers leave
their error messages. Workers start in the driver's working directory; rank 0 writes the outputs,
which must be on a filesystem every worker sees. A failed worker ends the launch with one
GenomeLMError naming the rank and its error, and what the job keeps.

`GENOME_LM_FAULT=STEP[:RANK]` (testing): the worker of RANK (default 1) dies with exit code 13
right after optimizer step STEP (eval: after scoring round STEP), as a crashed or killed process
would.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from genome_lm.errors import GenomeLMError

log = logging.getLogger(__name__)
FAULT_ENV = "GENOME_LM_FAULT"
FORWARDED_ENV = (FAULT_ENV, "WANDB_MODE", "WANDB_SILENT", "TQDM_DISABLE")


@dataclass
class Job:
    """One distributed launch: every worker runs `fn(*args, device=DEVICE)` (DEVICE None: the
    worker picks its own from LOCAL_RANK)."""

    fn: Callable  # module level: pickled by reference
    args: tuple
    layout: Callable[[int], tuple[int, int]]  # processes -> (dp, cp); GenomeLMError when they do not fit
    describe: str  # for the log: "parallel: cp=8, dp=auto"
    keeps: str  # what stays after a failed worker and how to continue
    work_dir: Path  # the workers' error messages (and Ray's files): on a filesystem all workers see
    name: str = "run"
    default_workers: int | None = None  # Ray without --nproc: this many, else one per GPU of the cluster
    workers_hint: str = ""  # another way to give the number of Ray workers, for the error without GPUs


def maybe_inject_fault(step: int, rank: int) -> None:
    """Testing hook: die like a crashed worker after step `step` (see the module docstring)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    at, _, who = spec.partition(":")
    if step == int(at) and rank == int(who or 1):
        sys.stderr.write(f"genome_lm: {FAULT_ENV}={spec}: rank {rank} exits after step {step}\n")
        sys.stderr.flush()
        os._exit(13)


def check_count(nproc: int, what: str = "processes") -> int:
    """`--nproc N`, a number of local processes or Ray workers (`what`), must be >= 1; return it."""
    if nproc < 1:
        raise GenomeLMError(f"--nproc {nproc}: the number of {what} must be >= 1")
    return nproc


def _setup_worker_logging(rank: int) -> None:
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        force=True)


def _run_worker(fn: Callable, args: tuple, error_dir: str | None, device=None):
    """Body of every worker: run the job, and leave a one-line error behind for the launcher."""
    import torch

    rank = int(os.environ.get("RANK", "0"))
    try:
        if device is None and not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
        return fn(*args, device=device)
    except BaseException as e:
        user = isinstance(e, GenomeLMError)
        if error_dir:
            msg = str(e) if user else (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0]
            try:
                Path(error_dir, f"rank_{rank:05d}").write_text(json.dumps({"user": user, "message": msg}))
            except OSError:
                pass
        if not user:
            traceback.print_exc()
        raise


def elastic_worker(fn: Callable, args: tuple, error_dir: str):
    """Entry point of each `--nproc` process (module level: the launcher pickles it)."""
    _setup_worker_logging(int(os.environ.get("RANK", "0")))
    try:
        return _run_worker(fn, args, error_dir)
    except GenomeLMError:
        sys.exit(2)  # the launcher reports the message; no traceback for a user error


def _worker_error(error_dir: str, world: int, launcher: str, keeps: str) -> GenomeLMError | None:
    """The error to report for a failed launch, from the messages the workers left. A user error
    (GenomeLMError, the same on every rank) is reported as is. A rank that left no message died
    (crash, kill, out of memory) and is the likely cause: the others then fail on a closed
    connection."""
    found = {int(f.name.split("_")[1]): json.loads(f.read_text()) for f in Path(error_dir).glob("rank_*")}
    if not found:
        return None
    users = [e["message"] for _, e in sorted(found.items()) if e["user"]]
    if users:
        return GenomeLMError(users[0])
    silent = sorted(set(range(world)) - set(found))
    if silent:
        rank, msg = silent[0], "died without an error message (crashed, killed or out of memory; see its log above)"
    else:
        rank = min(found)
        msg = found[rank]["message"]
    return _failed(launcher, rank, msg, keeps)


def _failed(launcher: str, rank: int, msg: str, keeps: str) -> GenomeLMError:
    return GenomeLMError(f"{launcher}: rank {rank} failed: {msg}. {keeps}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(job: Job, nproc: int):
    """Run `job` on `nproc` local processes through torch's elastic launcher; rank 0's return value.
    `nproc` is checked against the GPUs of this node and the job's layout first."""
    import torch
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    check_count(nproc)
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise GenomeLMError(f"--nproc {nproc}: this node has {torch.cuda.device_count()} GPUs (one process per GPU); "
                            "use --ray for several nodes")
    job.layout(nproc)
    error_dir = tempfile.mkdtemp(prefix="genome_lm_errors_")
    log_dir = tempfile.mkdtemp(prefix="genome_lm_elastic_")  # the launcher's (empty: nothing is redirected)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{_free_port()}", max_restarts=0, monitor_interval=0.5, start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    log.info("launching %d processes (%s)", nproc, job.describe)
    # the launcher logs each failed worker's traceback; workers print their own (none for user errors)
    elastic_log = logging.getLogger("torch.distributed.elastic")
    level = elastic_log.level
    elastic_log.setLevel(logging.CRITICAL)
    try:
        results = elastic_launch(config, elastic_worker)(job.fn, job.args, error_dir)
    except ChildFailedError as e:
        err = _worker_error(error_dir, nproc, f"--nproc {nproc}", job.keeps)
        if err is None:
            rank, failure = min(e.failures.items())
            err = _failed(f"--nproc {nproc}", rank, f"exited with code {failure.exitcode}", job.keeps)
        raise err from None
    finally:
        elastic_log.setLevel(level)
        shutil.rmtree(error_dir, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)
    return results.get(0)


# ---------------------------------------------------------------------------------------------
# Ray Train


def _ray_worker(config: dict) -> None:
    """Entry point of each Ray Train worker (the process group is already initialised)."""
    import ray.train
    import ray.train.torch

    os.chdir(config["cwd"])
    for key, value in config["env"].items():  # the driver's view, also where it unset a variable
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    rank = ray.train.get_context().get_world_rank()
    os.environ.setdefault("RANK", str(rank))
    _setup_worker_logging(rank)
    _run_worker(config["fn"], config["args"], config["error_dir"], device=ray.train.torch.get_device())


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an address nothing listens on (ray.init would retry for minutes)."""
    if address in ("auto", "local"):
        return
    client = address.startswith("ray://")
    hostport = address.removeprefix("ray://").split("/")[0]
    host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
    port_n = int(port) if port.isdigit() else (10001 if client else 6379)
    try:
        with socket.create_connection((host or "127.0.0.1", port_n), timeout=timeout_s):
            pass
    except OSError as e:
        raise GenomeLMError(f"--ray {address}: cannot reach a Ray cluster there ({e.strerror or e}); start one with "
                            "`ray start --head`, check the address (ray://HOST:10001 or HOST:6379), or give no "
                            "address for a local instance") from None


def _ray_init(address: str | None, nproc: int | None):
    import ray

    if ray.is_initialized():
        return
    try:
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
        else:
            ray.init(num_cpus=(nproc or 1) + 1, include_dashboard=False, object_store_memory=200 * 2**20)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise GenomeLMError(f"--ray: cannot start or reach {where}: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; "
                            "check the address (ray://HOST:10001, HOST:6379 or auto) and that `ray status` works "
                            "there, or give no address for a local instance") from None


def ray_workers(job: Job, nproc: int | None) -> tuple[int, bool]:
    """(number of workers, use_gpu) on the connected cluster: --nproc, else the job's default
    (training: cp x dp when dp is a number), else one per GPU of the cluster."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    nproc = nproc if nproc is not None else job.default_workers
    if nproc is None:
        if not gpus:
            raise GenomeLMError(f"--ray: the cluster has no GPUs; give the number of CPU workers with --nproc N"
                                f"{job.workers_hint}")
        nproc = gpus
    check_count(nproc, "workers")
    job.layout(nproc)
    if gpus and nproc > gpus:
        raise GenomeLMError(f"--ray: {nproc} workers need {nproc} GPUs, the cluster has {gpus}")
    return nproc, gpus > 0


def run_ray(job: Job, address: str | None = None, nproc: int | None = None) -> None:
    """Run `job` under Ray Train's TorchTrainer (one worker per GPU, or per CPU slot)."""
    if nproc is not None:
        check_count(nproc, "workers")
    if address:
        _check_reachable(address)
    _ray_init(address, nproc)
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    workers, use_gpu = ray_workers(job, nproc)
    job.work_dir.mkdir(parents=True, exist_ok=True)  # on the filesystem every worker sees: so are their messages
    error_dir = tempfile.mkdtemp(prefix=".errors-", dir=job.work_dir)
    env = {k: os.environ.get(k) for k in FORWARDED_ENV}
    trainer = TorchTrainer(
        _ray_worker,
        train_loop_config={"fn": job.fn, "args": job.args, "cwd": os.getcwd(), "error_dir": error_dir, "env": env},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
        run_config=RunConfig(name=f"{job.name}-{uuid.uuid4().hex[:6]}",
                             storage_path=str((job.work_dir / "ray").resolve()),
                             failure_config=FailureConfig(max_failures=0)),
    )
    log.info("Ray Train: %d workers (%s), %s", workers, "GPU" if use_gpu else "CPU", job.describe)
    try:
        trainer.fit()
    except Exception as e:  # Ray wraps worker errors (TrainingFailedError, WorkerGroupError, ...)
        err = _worker_error(error_dir, workers, "--ray", job.keeps)
        if err is None:
            err = GenomeLMError(f"--ray: a worker failed: {(str(e).strip().splitlines() or [type(e).__name__])[0]}. "
                                f"{job.keeps}")
        raise err from None
    finally:
        shutil.rmtree(error_dir, ignore_errors=True)
