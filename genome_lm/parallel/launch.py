"""Launching a `Job` (`train`, `eval`) on several processes (docs/parallel.md, docs/long-runs.md):
`run_local` (--nproc N: torch's elastic launcher) and `run_ray` (--ray [ADDRESS]: Ray Train). Restarts
(`--max-restarts N`) start the whole group again, each worker counting its starts in the message folder
(`attempt_K/started_RANK`); a GenomeLMError is not retried. Once no restart is left, one GenomeLMError names the
rank, its node and its error. SIGTERM or SIGUSR1 to a launcher are passed on (under Ray as a stop file): `Preempted`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from genome_lm.errors import EXIT_PREEMPTED, GenomeLMError, Preempted, first_line
from genome_lm.parallel import callbacks

log = logging.getLogger(__name__)
FORWARDED_ENV = ("WANDB_MODE", "WANDB_SILENT", "TQDM_DISABLE", "GENOME_LM_OUTPUT_HOLDER")


@dataclass(frozen=True)
class WorkerContext:
    """What a worker knows of its launch (`worker=` of the job's function); the default: not launched."""

    attempt: int = 0  # 0, then k after k restarts
    max_restarts: int = 0
    message_file: Path | None = None
    stop_file: Path | None = None  # created by the launcher on a preemption signal

    def record_failure(self, message: str, user: bool = False, preempted: bool = False) -> None:
        """Leave this worker's one-line error for the launcher and the next attempt."""
        if self.message_file is not None:
            with contextlib.suppress(OSError):
                self.message_file.write_text(json.dumps({"user": user, "preempted": preempted, "message": message,
                                                         "node": socket.gethostname()}))


@dataclass
class Job:
    """One distributed launch: every worker runs `fn(*args, device=DEVICE, worker=WorkerContext)`
    (DEVICE None: the worker picks its own from LOCAL_RANK)."""

    fn: Callable  # module level: pickled by reference
    args: tuple
    layout: Callable[[int], tuple[int, int]]  # processes -> (dp, cp); GenomeLMError when they do not fit
    describe: str  # for the log: "parallel: cp=8, dp=auto"
    keeps: str  # what stays after a failed worker and how to continue
    work_dir: Path  # the workers' error messages (and Ray's files): on a filesystem all workers see
    name: str = "run"
    default_workers: int | None = None  # Ray without --nproc: this many, else one per GPU of the cluster
    workers_hint: str = ""  # another way to give the number of Ray workers, for the error without GPUs
    timeout_s: float = 1800  # the process group's timeout (parallel.timeout)


def _run_worker(fn: Callable, args: tuple, error_dir: str, hooks: tuple = (), max_restarts: int = 0,
                device=None):
    """Body of every worker: its logging, the launch's callbacks, its attempt, the job, a one-line error left behind."""
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        force=True)
    callbacks.clear()
    callbacks.install(*hooks)
    worker = WorkerContext(max_restarts=max_restarts)
    try:
        attempt = len(list(Path(error_dir).glob(f"attempt_*/started_{rank:05d}")))  # this rank's earlier starts
        folder = Path(error_dir, f"attempt_{attempt}")
        folder.mkdir(exist_ok=True)
        (folder / f"started_{rank:05d}").write_text(json.dumps({"node": socket.gethostname(), "pid": os.getpid()}))
        worker = WorkerContext(attempt, max_restarts, folder / f"rank_{rank:05d}", Path(error_dir, "stop"))
        for k in range(attempt):  # a restarted worker raises an earlier attempt's user error again
            for message in sorted(Path(error_dir, f"attempt_{k}").glob("rank_*")):
                if (found := json.loads(message.read_text())).get("user"):
                    raise GenomeLMError(found["message"])
        if attempt and rank == 0:  # what ended the last attempt
            what = attempt_failure(Path(error_dir, f"attempt_{attempt - 1}"), int(os.environ.get("WORLD_SIZE", "1")))
            said = f"rank {what[1]} on {what[2]}: {what[3]}" if what else "a worker stopped (no message)"
            log.warning("restart %d of %d: %s; %d restart(s) left; resuming from the newest complete checkpoint",
                        attempt, max_restarts, said, max_restarts - attempt)
        if device is None and not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
        return fn(*args, device=device, worker=worker)
    except BaseException as e:
        user, preempted = isinstance(e, GenomeLMError), isinstance(e, Preempted)
        if not isinstance(e, SystemExit):
            worker.record_failure(str(e) if user or preempted else first_line(e), user=user, preempted=preempted)
        if not (user or preempted):
            traceback.print_exc()
        raise


def elastic_worker(fn: Callable, args: tuple, error_dir: str, hooks: tuple = (), max_restarts: int = 0):
    """Entry point of each `--nproc` process (module level: the launcher pickles it)."""
    try:
        return _run_worker(fn, args, error_dir, hooks, max_restarts)
    except GenomeLMError:
        sys.exit(2)  # the launcher reports the message; no traceback for a user error
    except Preempted:
        sys.exit(EXIT_PREEMPTED)


def attempt_failure(folder: Path, world: int) -> tuple[str, int, str, str] | None:
    """(kind, rank, node, message) of what ended an attempt (None: no worker left anything): a user error,
    else a preemption, else a rank that left no message (it died; the others fail on a closed connection),
    else the lowest rank's error."""
    found = {int(f.name.split("_")[1]): json.loads(f.read_text()) for f in folder.glob("rank_*")}
    started = {int(f.name.split("_")[1]): json.loads(f.read_text()) for f in folder.glob("started_*")}
    if not found and not started:
        return None
    for kind in ("user", "preempted"):
        if ranks := [r for r, e in sorted(found.items()) if e.get(kind)]:
            return kind, ranks[0], found[ranks[0]]["node"], found[ranks[0]]["message"]
    if silent := sorted(set(range(world)) - set(found)):
        rank = silent[0]
        return ("died", rank, started.get(rank, {}).get("node", "?"),
                "died without an error message (crashed, killed or out of memory; see its log above)")
    rank = min(found)
    return "failed", rank, found[rank]["node"], found[rank]["message"]


def _launch_error(error_dir: str, world: int, launcher: str, keeps: str, otherwise: Exception | None):
    """The error of a failed launch's last attempt (`otherwise` when no worker left a message)."""
    attempts = sorted(Path(error_dir).glob("attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    what = attempt_failure(attempts[-1] if attempts else Path(error_dir, "attempt_0"), world)
    if what is None:
        return otherwise
    kind, rank, node, msg = what
    if kind == "user":
        return GenomeLMError(msg)
    if kind == "preempted":
        return Preempted(msg)
    return GenomeLMError(f"{launcher}: rank {rank} failed: {msg} (node {node}). {keeps}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the rendezvous of a local launch, gloo test groups)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(job: Job, nproc: int, max_restarts: int = 0):
    """Run `job` on `nproc` local processes (torch's elastic launcher); rank 0's return value."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise GenomeLMError(f"--nproc {nproc}: this node has {torch.cuda.device_count()} GPUs (one process per GPU); "
                            "use --ray for several nodes")
    job.layout(nproc)
    error_dir = tempfile.mkdtemp(prefix="genome_lm_errors_")  # also the launcher's logs (empty: none redirected)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=max_restarts, monitor_interval=0.5,
        start_method="spawn", logs_specs=DefaultLogsSpecs(log_dir=os.path.join(error_dir, "elastic")),
        signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        shutdown_timeout=600,  # how long a launcher that got a stop signal waits for its workers' checkpoint
    )
    log.info("launching %d processes (%s)%s", nproc, job.describe,
             f", up to {max_restarts} restart(s)" if max_restarts else "")
    # the launcher logs each failed worker's traceback; workers print their own (none for user errors)
    elastic_log = logging.getLogger("torch.distributed.elastic")
    level = elastic_log.level
    elastic_log.setLevel(logging.CRITICAL)
    try:
        results = elastic_launch(config, elastic_worker)(job.fn, job.args, error_dir, callbacks.installed(),
                                                         max_restarts)
    except (ChildFailedError, SignalException) as e:
        if isinstance(e, SignalException):
            otherwise: Exception = Preempted(f"the launcher got {signal.Signals(e.sigval).name} before the workers "
                                             "started training")
        else:
            rank, failure = min(e.failures.items())
            otherwise = GenomeLMError(f"--nproc {nproc}: rank {rank} failed: exited with code {failure.exitcode}. "
                                      f"{job.keeps}")
        raise _launch_error(error_dir, nproc, f"--nproc {nproc}", job.keeps, otherwise) from None
    finally:
        elastic_log.setLevel(level)
        shutil.rmtree(error_dir, ignore_errors=True)
    return results.get(0)


def _ray_worker(config: dict) -> None:
    """Entry point of each Ray Train worker (the process group is already initialised)."""
    import ray.train
    import ray.train.torch

    os.chdir(config["cwd"])
    for key in FORWARDED_ENV:  # the driver's view, also where it unset a variable
        value = config["env"].get(key)
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.environ.setdefault("RANK", str(ray.train.get_context().get_world_rank()))
    os.environ.setdefault("WORLD_SIZE", str(ray.train.get_context().get_world_size()))
    try:
        _run_worker(config["fn"], config["args"], config["error_dir"], config["hooks"], config["max_restarts"],
                    device=ray.train.torch.get_device())
    except Preempted:
        if not Path(config["error_dir"], "stop").exists():
            raise  # a signal reached this worker: Ray restarts the group while restarts are left
        # the driver asked every worker to stop: end without a failure, so Ray does not restart


def _ray_init(address: str | None, nproc: int | None):
    """Reach the Ray cluster at `address`, failing fast where nothing listens (ray.init would retry for
    minutes), or start a local instance."""
    if address and address not in ("auto", "local"):
        hostport = address.removeprefix("ray://").split("/")[0]
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
        port_n = int(port) if port.isdigit() else (10001 if address.startswith("ray://") else 6379)
        try:
            socket.create_connection((host or "127.0.0.1", port_n), timeout=5.0).close()
        except OSError as e:
            raise GenomeLMError(f"--ray {address}: cannot reach a Ray cluster there ({e.strerror or e}); start one "
                                "with `ray start --head`, check the address (ray://HOST:10001 or HOST:6379), or give "
                                "no address for a local instance") from None
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


def run_ray(job: Job, address: str | None = None, nproc: int | None = None, max_restarts: int = 0) -> None:
    """Run `job` under Ray Train's TorchTrainer; SIGTERM or SIGUSR1 create the stop file the workers read."""
    _ray_init(address, nproc)
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    gpus = int(ray.cluster_resources().get("GPU", 0))  # workers: --nproc, the job's default, or one per GPU
    workers = nproc if nproc is not None else job.default_workers or gpus
    if not workers:
        raise GenomeLMError(f"--ray: the cluster has no GPUs; give the number of CPU workers with --nproc N"
                            f"{job.workers_hint}")
    job.layout(workers)
    if gpus and workers > gpus:
        raise GenomeLMError(f"--ray: {workers} workers need {workers} GPUs, the cluster has {gpus}")
    use_gpu = gpus > 0
    job.work_dir.mkdir(parents=True, exist_ok=True)  # on the filesystem every worker sees: so are their messages
    error_dir = tempfile.mkdtemp(prefix=".errors-", dir=job.work_dir)
    env = {k: os.environ.get(k) for k in FORWARDED_ENV}
    trainer = TorchTrainer(
        _ray_worker,
        train_loop_config={"fn": job.fn, "args": job.args, "cwd": os.getcwd(), "error_dir": error_dir, "env": env,
                           "hooks": callbacks.installed(), "max_restarts": max_restarts},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo", timeout_s=int(job.timeout_s)),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
        run_config=RunConfig(name=f"{job.name}-{uuid.uuid4().hex[:6]}",
                             storage_path=str((job.work_dir / "ray").resolve()),
                             failure_config=FailureConfig(max_failures=max_restarts)),
    )
    log.info("Ray Train: %d workers (%s), %s%s", workers, "GPU" if use_gpu else "CPU", job.describe,
             f", up to {max_restarts} restart(s)" if max_restarts else "")
    stop = Path(error_dir, "stop")

    def ask_workers_to_stop(signum, _frame) -> None:
        log.warning("%s received: every worker checkpoints at its next step boundary, then the launch stops",
                    signal.Signals(signum).name)
        stop.touch()

    old = {sig: signal.signal(sig, ask_workers_to_stop) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        trainer.fit()
        if stop.exists() and (err := _launch_error(error_dir, workers, "--ray", job.keeps, None)) is not None:
            raise err
    except Exception as e:  # Ray wraps worker errors (TrainingFailedError, WorkerGroupError, ...)
        if isinstance(e, (GenomeLMError, Preempted)):
            raise
        said = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise _launch_error(error_dir, workers, "--ray", job.keeps,
                            GenomeLMError(f"--ray: a worker failed: {said}. {job.keeps}")) from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        shutil.rmtree(error_dir, ignore_errors=True)

