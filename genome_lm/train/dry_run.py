"""`genome-lm train EXP --dry-run [--nproc N]`: check an experiment end to end without training.

`dry_run` builds the model on the meta device (nothing is allocated), reads the data's pieces and
prints what a run would do: parameters, token map, shapes, memory strategy, precision, and the
per-rank shapes of the experiment's `parallel: {cp, dp}` layout (`layout_summary`): the slab each
CP rank keeps, what the CP layers exchange, and how many parameters each rank holds once FSDP2
shards them (dim 0 over all dp x cp ranks, padded).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from genome_lm.config import ExperimentConfig
from genome_lm.parallel.cp import slab_bounds
from genome_lm.parallel.fsdp import sharded_numel
from genome_lm.parallel.mesh import default_device, resolve_layout
from genome_lm.train.data import SequenceStream
from genome_lm.train.trainer import build_model, check_data, compute_dtype, model_token_map, resolve_init


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


def dry_run(cfg: ExperimentConfig, device: torch.device | None = None, world: int | None = None) -> dict:
    """Check the experiment end to end without training: data, model on the meta device, token
    map, shapes, memory strategy and the per-rank shapes of the parallel layout on `world`
    processes (default cp x dp). Prints a summary and returns it."""
    from genome_lm.model import count_parameters, format_counts

    device = device or default_device()
    manifest = check_data(cfg)
    init = resolve_init(cfg, dry=True)
    model = build_model(cfg, device, init, meta=True)
    lut = model_token_map(cfg, manifest, model.config.vocab_size, init)
    stream = SequenceStream(cfg.data.shards, cfg.data.split, cfg.data.seq_len, seed=cfg.data.seed,
                            reverse_complement=cfg.data.reverse_complement, min_piece=cfg.data.min_piece,
                            ignore_n=cfg.data.ignore_n, token_map=lut)
    counts = count_parameters(model)
    B, T = cfg.train.micro_batch, cfg.data.seq_len
    tokens_per_step = B * T * cfg.train.grad_accum
    summary = {
        "experiment": cfg.name,
        "model": cfg.model.name,
        "init": cfg.model.init,
        "dtype": cfg.model.dtype,
        "parameters": counts,
        "layers": {t: model.config.layer_types.count(t) for t in sorted(set(model.config.layer_types))},
        "data": {"shards": cfg.data.shards, "split": cfg.data.split, "pieces": len(stream.pieces),
                 "tokens_per_epoch": stream.tokens_per_epoch},
        "token_map": {sym: int(lut[i]) for sym, i in manifest["vocab"].items()},
        "shapes": {"input_ids": [B, T],
                   "hidden_per_layer_input": [B, T, model.config.hc_mult, model.config.hidden_size]},
        "tokens_per_step": tokens_per_step,
        "steps": cfg.train.steps,
        "memory": cfg.memory.model_dump(),
        "parallel": cfg.parallel.model_dump(),
        "layout": layout_summary(model, cfg, world),
    }
    print(f"experiment {cfg.name}: {cfg.model.name} ({cfg.model.dtype}), "
          f"init {cfg.model.init or 'preset initialisation'}")
    print(format_counts(counts))
    print(f"layers: {summary['layers']}")
    print(f"data: {cfg.data.shards}/{cfg.data.split}: {len(stream.pieces)} pieces, "
          f"{stream.tokens_per_epoch:,} tokens per epoch; token map {summary['token_map']}")
    print(f"per step: input_ids [{B}, {T:,}] x {cfg.train.grad_accum} micro-batches = {tokens_per_step:,} tokens; "
          f"layer input [{B}, {T:,}, {model.config.hc_mult}, {model.config.hidden_size}]")
    m = cfg.memory
    print(f"memory: recompute={m.recompute}{' ' + str(m.recompute_layers) if m.recompute == 'selective' else ''}, "
          f"offload_layer_inputs={m.offload_layer_inputs}, moe_block_tokens={m.moe_block_tokens}, "
          f"dsa_block_queries={m.dsa_block_queries}, loss_chunk_tokens={m.loss_chunk_tokens}")
    summary["precision"] = _precision_line(cfg, model)
    print(summary["precision"])
    print(f"parallel: cp={cfg.parallel.cp}, dp={cfg.parallel.dp}")
    print(format_layout(summary["layout"]))
    summary["init"], summary["checkpoints"] = _init_line(cfg, summary["layout"]), _checkpoint_line(cfg)
    print(summary["init"])
    print(summary["checkpoints"])
    print("dry run OK: nothing was trained")
    return summary


def _precision_line(cfg: ExperimentConfig, model) -> str:
    """What training computes in and what the optimizer updates (`genome_lm.parallel.fsdp`)."""
    from genome_lm.parallel.fsdp import fp32_modules

    if compute_dtype(cfg) is None:
        return "precision: float32 parameters, compute and AdamW states (TF32 matmuls on CUDA: train.tf32)"
    groups = sum(len(fp32_modules(layer)) for layer in model.model.layers)
    return ("precision: bf16 compute; float32 master weights, gradients and AdamW states, sharded by FSDP2 (16 "
            f"bytes per parameter); upstream's float32 exceptions in {groups} float32 FSDP2 groups of their own "
            "(routers, conv1d, forget gates, hyper-connections); model/ exports in bf16")


def _init_line(cfg: ExperimentConfig, layout: dict) -> str:
    """How the weights get onto the ranks, and the host memory that takes."""
    from genome_lm.model.presets import is_preset

    world, itemsize = layout["world"], layout["parameter_bytes_per_rank"] / max(1, layout["parameters_per_rank"])
    whole, share = layout["parameters_total"] * itemsize, layout["parameter_bytes_per_rank"]
    source = f"model.init {cfg.model.init}" if cfg.model.init else (
        "preset initialisation" if is_preset(cfg.model.name) else f"weights of {cfg.model.name}")
    if world == 1:
        return f"init: {source}; one process holds the whole model ({_gib(whole)})"
    if cfg.model.init or not is_preset(cfg.model.name):
        return (f"init: {source}; built on the meta device, sharded, then each of the {world} ranks reads only its "
                f"rows of each tensor from the safetensors files ({_gib(share)} of weights per rank)")
    return (f"init: {source}; each of the {world} ranks first builds the whole model on CPU ({_gib(whole)}), then "
            f"keeps its shards ({_gib(share)})")


def _checkpoint_line(cfg: ExperimentConfig) -> str:
    when = {True: "at every checkpoint", "last": "at the last checkpoint only", False: "never"}
    export = when[cfg.train.export_model]
    return (f"checkpoints: every {cfg.train.checkpoint_every} steps, train_state/ (DCP); model/ (Hugging Face "
            f"weights, streamed one tensor at a time) {export}" +
            ("" if cfg.train.export_model is True else "; `genome-lm export CHECKPOINT --out DIR` writes it later"))
