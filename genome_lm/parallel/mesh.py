"""The process layout (docs/parallel.md): world = dp x cp ranks on a DeviceMesh ("dp", "cp"), cp inner (a
CP group's ranks are consecutive), with EP the same ranks as ("edp", "ep"); FSDP shards over dp x cp. A
single process gets a trivial context, or with `sharded=True` (bf16 training: float32 master weights) a
1-rank process group on an in-memory store and a (1, 1) mesh, to run the same FSDP2 path. `resolve_layout`
is the one dp x cp resolver of training, eval and the planner, each refusing in its own words."""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Literal

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.rendezvous import rendezvous

from genome_lm.errors import GenomeLMError
from genome_lm.model.patch import has_values

log = logging.getLogger(__name__)


# The refusals of `resolve_layout`: too_few (cp > world), not_divisor (cp does not divide world), dp_mismatch
# (dp x cp != world), as `str.format` templates over cp, dp, world, need (dp x cp), lower / upper (the
# multiples of cp on either side of world) and nproc ("add --nproc" for one process, else "launch with --nproc").
RUN_WORDS = dict(
    too_few="parallel.cp={cp} needs at least {cp} processes, this launch has {world}; launch with --nproc {cp} "
            "(or a multiple of it) or lower parallel.cp",
    not_divisor="parallel.cp={cp} does not divide the {world} processes of this launch; use a number of processes "
                "that is a multiple of {cp}",
    dp_mismatch="parallel.dp={dp} x parallel.cp={cp} = {need} processes, but this launch has {world}; set "
                "parallel.dp: auto or launch {need} processes",
)


def resolve_layout(cp: int, dp: int | Literal["auto"], world: int, words: dict = RUN_WORDS) -> tuple[int, int]:
    """(dp, cp) of `world` processes given cp and dp (or "auto": world / cp); GenomeLMError in `words`."""

    def refuse(template: str) -> GenomeLMError:
        need = int(dp) * cp if dp != "auto" else world
        nproc = "add --nproc" if world == 1 else "launch with --nproc"
        return GenomeLMError(template.format(cp=cp, dp=dp, world=world, need=need, lower=world - world % cp,
                                            upper=-(-world // cp) * cp, nproc=nproc))

    if dp != "auto" and int(dp) * cp != world:  # the one count that fits: dp x cp
        raise refuse(words["dp_mismatch"])
    if cp > world:
        raise refuse(words["too_few"])
    if world % cp:
        raise refuse(words["not_divisor"])
    return (world // cp if dp == "auto" else int(dp)), cp


def check_layout(parallel_cfg, world: int, n_routed_experts: int | None = None) -> tuple[int, int]:
    """(dp, cp) of `parallel: {cp, dp, ep}` on `world` processes; GenomeLMError unless they fit and ep
    divides the processes (and `n_routed_experts`, when given)."""
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
    reduce_dtype: str = "float32"  # FSDP2 settings from `parallel:` (`parallel.apply_fsdp`)
    backward_prefetch: int = 1
    owns_process_group: bool = False

    def __post_init__(self):
        self.distributed = self.world > 1
        self.is_main = self.rank == 0
        self.dp_rank, self.cp_rank = divmod(self.rank, self.cp)  # cp is the inner dimension

    @property
    def sharded(self) -> bool:
        """FSDP2 applies: several ranks, or one process given a 1-rank mesh."""
        return self.mesh is not None

    @property
    def cp_group(self):
        return self.mesh.get_group("cp") if self.mesh is not None else None

    @functools.cached_property
    def fsdp_mesh(self):
        """The 1-D mesh FSDP shards over: all dp x cp ranks (a sharded context's)."""
        if self.dp > 1 and self.cp > 1:
            return self.mesh["dp", "cp"]._flatten("dp_cp")
        return self.mesh["cp"] if self.cp > 1 else self.mesh["dp"]

    @functools.cached_property
    def ep_mesh(self):
        """("edp", "ep"): EP groups of `ep` consecutive ranks, "edp" those with the same experts; None without EP."""
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

    def on_main(self, fn: Callable[[], Any], share: bool = True) -> Any:
        """Run `fn` on rank 0; hand its GenomeLMError to every rank, its result too (`share` False: None elsewhere)."""
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except GenomeLMError as e:
                error = str(e)
        sent, error = self.broadcast_object((result if share else None, error))
        if error is not None:
            raise GenomeLMError(error)
        return result if self.is_main else sent

    def shutdown(self) -> None:
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_process_group = False


def init_parallel(parallel_cfg, device: torch.device | None = None, sharded: bool = False) -> ParallelContext:
    """This process's layout: in the process group a launcher prepared (elastic's environment, Ray Train's group)."""
    device = device or default_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend, timeout = "nccl" if device.type == "cuda" else "gloo", timedelta(seconds=parallel_cfg.timeout)
    world, rank, owns = 1, 0, False  # one process, unless a launcher prepared a group
    if dist.is_available() and dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # the launcher's store, keys under a prefix of the attempt: the elastic launcher keeps one store
        # across restarts, with the addresses a dead worker left there
        store, rank, world = next(rendezvous("env://", timeout=timeout))
        store = dist.PrefixStore(f"genome_lm/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        owns = True
    dp, cp = check_layout(parallel_cfg, world)
    if world == 1 and not sharded:
        return ParallelContext(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():  # one process: a 1-rank group on an in-memory store
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        owns = True
    mesh = init_device_mesh(device.type, (dp, cp), mesh_dim_names=("dp", "cp"))
    par = ParallelContext(world=world, rank=rank, dp=dp, cp=cp, device=device, mesh=mesh,
                          ep=parallel_cfg.ep, reduce_dtype=parallel_cfg.reduce_dtype,
                          backward_prefetch=parallel_cfg.backward_prefetch, owns_process_group=owns)
    par.ep_mesh  # created now, by every rank together
    log.info("parallel: %s", par.describe())
    return par
