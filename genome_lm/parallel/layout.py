"""Per-rank shapes of a parallel layout, for `genome-lm train EXP --dry-run [--nproc N]`.

Computed from the model on the meta device (nothing is allocated) and the experiment's
`parallel: {cp, dp}`: the slab each CP rank keeps, what the CP layers exchange, and how many
parameters each rank holds once FSDP2 shards them (dim 0 over all dp x cp ranks, padded).
"""

from __future__ import annotations

from collections import Counter

from torch import nn

from genome_lm.parallel.cp import slab_bounds
from genome_lm.parallel.fsdp import sharded_numel
from genome_lm.parallel.mesh import resolve_layout


def _world_for(parallel, world: int | None) -> int:
    if world is not None:
        return world
    return parallel.cp * (1 if parallel.dp == "auto" else int(parallel.dp))


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def layout_summary(model: nn.Module, cfg, world: int | None = None) -> dict:
    """The per-rank shapes of `cfg`'s layout on `world` processes (default cp x dp)."""
    world = _world_for(cfg.parallel, world)
    dp, cp = resolve_layout(cfg.parallel.cp, cfg.parallel.dp, world)
    c = model.config
    B, T = cfg.train.micro_batch, cfg.data.seq_len
    bounds = slab_bounds(T, cp)
    lengths = [b1 - b0 for b0, b1 in zip(bounds, bounds[1:])]
    total = sum(p.numel() for p in model.parameters())
    per_rank = sum(sharded_numel(p.shape, world) for p in model.parameters()) if world > 1 else total
    itemsize = next(model.parameters()).element_size()
    n_kda = c.layer_types.count("linear_attention")
    n_dsa = len(c.layer_types) - n_kda
    K, H = c.linear_head_dim, c.linear_num_heads
    return {
        "world": world, "dp": dp, "cp": cp,
        "global_batch_sequences": dp * B * cfg.train.grad_accum,
        "slab_lengths": lengths,
        "slab_bounds": bounds,
        "input_ids_per_rank": [B, max(lengths)],
        "layer_input_per_rank": [B, max(lengths), c.hc_mult, c.hidden_size],
        "kda_exchange_per_layer": {"maps": [B, cp, H, K, 2 * K], "conv_tails": [B, cp * (c.linear_conv_kernel_dim - 1),
                                                                              3 * H * K]},
        "dsa_gathered_per_layer": {"latent": [B, T, c.kv_lora_rank], "index_keys": [B, T, c.index_head_dim]},
        "layers": {"kda": n_kda, "dsa": n_dsa},
        "parameters_total": total,
        "parameters_per_rank": per_rank,
        "parameter_bytes_per_rank": per_rank * itemsize,
        "adam_state_bytes_per_rank": per_rank * itemsize * 2,
    }


def format_layout(s: dict) -> str:
    counts = Counter(s["slab_lengths"])
    slabs = ", ".join(f"{n:,} tokens x {k}" for n, k in counts.items())
    B, Tr = s["input_ids_per_rank"]
    dsa = s["dsa_gathered_per_layer"]
    return "\n".join([
        f"layout: {s['world']} ranks = dp {s['dp']} x cp {s['cp']}; global batch {s['global_batch_sequences']} "
        f"sequences per step",
        f"  CP slabs per sequence: {slabs} (bounds {s['slab_bounds'] if s['cp'] <= 8 else '...'})",
        f"  per rank: input_ids [{B}, {Tr:,}], layer input {s['layer_input_per_rank']}",
        f"  KDA layers ({s['layers']['kda']}): all-gather maps {s['kda_exchange_per_layer']['maps']} fp32 and conv "
        f"tails {s['kda_exchange_per_layer']['conv_tails']}",
        f"  DSA layers ({s['layers']['dsa']}): all-gather latent {dsa['latent']} and index keys {dsa['index_keys']}",
        f"  FSDP2 over {s['world']} ranks: {s['parameters_per_rank']:,} of {s['parameters_total']:,} "
        "parameters per rank "
        f"({_gib(s['parameter_bytes_per_rank'])} weights + {_gib(s['adam_state_bytes_per_rank'])} AdamW state)",
    ])
