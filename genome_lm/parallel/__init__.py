"""Scale-out: context parallelism, FSDP2 sharding over a (dp, cp) DeviceMesh, and launching.

- `cp`: sequences split into contiguous slabs over a CP group (`apply_context_parallel`), with
  `cp_kda` / `cp_dsa` layer wrappers and autograd-aware `collectives`;
- `mesh`: the process layout (`ParallelContext`: world, dp x cp mesh, groups, device);
- `fsdp`: FSDP2 `fully_shard` per decoder layer + root, gradient clipping, state dicts;
- `launch`: `--nproc N` (torch elastic launcher) and `--ray [ADDRESS]` (Ray Train).
Applied from `genome_lm.train.parallelize`; the model code stays single-device.
"""

from genome_lm.parallel.cp import CPContext, apply_context_parallel, slab_bounds

__all__ = ["CPContext", "apply_context_parallel", "slab_bounds"]
