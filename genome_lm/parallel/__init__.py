"""Scale-out: context parallelism, FSDP2 sharding over a (dp, cp) DeviceMesh, and launching.

- `cp`: sequences split into contiguous slabs over a CP group (`apply_context_parallel` hands the
  group's `CPContext` to the causal LM and its long-context layers, which take the CP path);
- `mesh`: the process layout (`ParallelContext`: world, dp x cp mesh, groups, device);
- `fsdp`: FSDP2 `fully_shard` per decoder layer + root, gradient clipping, state dicts;
- `launch`: `--nproc N` (torch elastic launcher) and `--ray [ADDRESS]` (Ray Train).
Applied from `genome_lm.train.parallelize`.
"""

from genome_lm.parallel.cp import CPContext, apply_context_parallel, slab_bounds

__all__ = ["CPContext", "apply_context_parallel", "slab_bounds"]
