"""The process layout (docs/parallel.md): world = dp x cp ranks on a DeviceMesh ("dp", "cp"), cp the
inner dimension (a CP group's ranks are consecutive); with expert parallelism the same ranks as
("edp", "ep"). FSDP shards over the flattened dp x cp mesh. A single process gets a trivial context
(every collective the identity), or with `sharded=True` (bf16 training: FSDP2 keeps float32 master
weights) a 1-rank process group on an in-memory store and a (1, 1) mesh, to run the same FSDP2 path."""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from genome_lm.errors import GenomeLMError
from genome_lm.model.values import has_values
from genome_lm.parallel.layout import resolve_layout

log = logging.getLogger(__name__)


def check_layout(parallel_cfg, world: int, n_routed_experts: int | None = None) -> tuple[int, int]:
    """(dp, cp) of `parallel: {cp, dp, ep}` on `world` processes; GenomeLMError naming the key unless cp
    and dp fit (`resolve_layout`) and ep divides the processes (and `n_routed_experts`, when given)."""
    dp, cp = resolve_layout(parallel_cfg.cp, parallel_cfg.dp, world)
    ep = parallel_cfg.ep
    if n_routed_experts:  # first: the process count the next refusal advises must suit the experts too
        check_expert_split(ep, n_routed_experts)
    if world % ep:
        raise GenomeLMError(f"parallel.ep={ep} does not divide the {world} processes of this launch; "
                            f"use a number of processes that is a multiple of {math.lcm(ep, cp)}"
                            + (f" (parallel.cp={cp} divides it too)" if cp > 1 else "")
                            + (" and set parallel.dp: auto" if parallel_cfg.dp != "auto" else "")
                            + ("" if n_routed_experts else " (--dry-run also checks that it divides the model's routed "
                               "experts)"))
    return dp, cp


def check_expert_split(ep: int, n_routed_experts: int) -> None:
    """GenomeLMError unless `parallel.ep` divides the routed experts."""
    if n_routed_experts % ep:
        raise GenomeLMError(f"parallel.ep={ep} does not divide the {n_routed_experts} routed experts; "
                            f"use a divisor of {n_routed_experts}")


def default_device(local_rank: int = 0) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


@dataclass
class ParallelContext:
    """Where this process sits: rank in the world, its dp replica and CP group; small collectives."""

    world: int = 1
    rank: int = 0
    dp: int = 1
    cp: int = 1
    device: torch.device = torch.device("cpu")
    mesh: Any = None  # DeviceMesh ("dp", "cp") when distributed
    ep: int = 1
    reduce_dtype: str = "float32"  # FSDP2 settings from `parallel:` (`parallel.fsdp.apply_fsdp`)
    backward_prefetch: int = 1
    owns_process_group: bool = False

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def sharded(self) -> bool:
        """FSDP2 applies: several ranks, or one process given a 1-rank mesh."""
        return self.mesh is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        return self.rank // self.cp

    @property
    def cp_rank(self) -> int:
        return self.rank % self.cp

    @property
    def cp_group(self):
        return self.mesh.get_group("cp") if self.mesh is not None else None

    @functools.cached_property
    def fsdp_mesh(self):
        """The 1-D mesh FSDP shards over: all dp x cp ranks."""
        if self.mesh is None:
            return None
        if self.dp > 1 and self.cp > 1:
            return self.mesh["dp", "cp"]._flatten("dp_cp")
        return self.mesh["cp"] if self.cp > 1 else self.mesh["dp"]

    @functools.cached_property
    def ep_mesh(self):
        """The ("edp", "ep") mesh: EP groups of `ep` consecutive ranks; "edp" joins the ranks that hold the
        same experts. None without EP."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.mesh is None or self.ep == 1:
            return None
        return init_device_mesh(self.device.type, (self.world // self.ep, self.ep), mesh_dim_names=("edp", "ep"))

    def describe(self) -> str:
        ep = f", ep {self.rank % self.ep}/{self.ep}" if self.ep > 1 else ""
        return (f"rank {self.rank}/{self.world} (dp {self.dp_rank}/{self.dp}, cp {self.cp_rank}/{self.cp}{ep}) "
                f"on {self.device}")

    def _reduce(self, values: list[float], op, group) -> list[float]:
        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op, group=group)
        return t.tolist() if has_values(t) else values  # fake tensors (the rehearsal) hold no values

    def sum_dp(self, *values: float) -> list[float]:
        """Sum over the data-parallel replicas (CP ranks of one replica hold the same values)."""
        return self._reduce(list(values), dist.ReduceOp.SUM, self.mesh.get_group("dp")) if self.dp > 1 else list(values)

    def sum_all(self, *values: float) -> list[float]:
        """Sum over every rank."""
        return self._reduce(list(values), dist.ReduceOp.SUM, None)

    def max_all(self, value: float) -> float:
        return self._reduce([value], dist.ReduceOp.MAX, None)[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def on_main(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on rank 0 and hand its result (or its GenomeLMError) to every rank."""
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except GenomeLMError as e:
                error = str(e)
        result, error = self.broadcast_object((result, error))
        if error is not None:
            raise GenomeLMError(error)
        return result

    def shutdown(self) -> None:
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_process_group = False


def _init_from_env(backend: str, timeout: timedelta) -> None:
    """Join the process group of a launcher's environment, its keys under a prefix of the attempt: the
    elastic launcher keeps one store across restarts, with the addresses a dead worker left there."""
    from torch.distributed.rendezvous import rendezvous

    store, rank, world = next(rendezvous("env://", timeout=timeout))
    store = dist.PrefixStore(f"genome_lm/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def init_parallel(parallel_cfg, device: torch.device | None = None, timeout_s: float = 1800,
                  sharded: bool = False) -> ParallelContext:
    """The layout of this process: in the process group a launcher prepared (torch elastic's environment,
    or Ray Train's initialised group), else a single process."""
    from torch.distributed.device_mesh import init_device_mesh

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = device or default_device(local_rank)
    backend, timeout = "nccl" if device.type == "cuda" else "gloo", timedelta(seconds=timeout_s)
    owns = False
    if dist.is_available() and dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _init_from_env(backend, timeout)
        world, rank, owns = dist.get_world_size(), dist.get_rank(), True
    else:
        world, rank = 1, 0
    dp, cp = check_layout(parallel_cfg, world)
    ep = parallel_cfg.ep
    if world == 1 and not sharded:
        return ParallelContext(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():  # one process: a 1-rank group on an in-memory store
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        owns = True
    mesh = init_device_mesh(device.type, (dp, cp), mesh_dim_names=("dp", "cp"))
    par = ParallelContext(world=world, rank=rank, dp=dp, cp=cp, device=device, mesh=mesh,
                          ep=ep, reduce_dtype=parallel_cfg.reduce_dtype,
                          backward_prefetch=parallel_cfg.backward_prefetch, owns_process_group=owns)
    par.ep_mesh  # created now, by every rank together
    log.info("parallel: %s", par.describe())
    return par
