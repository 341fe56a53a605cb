"""`genome-lm train EXP --dry-run [--nproc N]`: check an experiment end to end without training.

`dry_run` builds the model on the meta device (nothing is allocated), reads the data's pieces and
prints what a run would do: parameters, token map, shapes, memory strategy, precision, and the
per-rank shapes of the experiment's `parallel: {cp, dp}` layout (`layout_lines`): the slab each
CP rank keeps, what the CP layers exchange, and how many parameters each rank holds once FSDP2
shards them (dim 0 over all dp x cp ranks, padded).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch import nn

from genome_lm.config import ExperimentConfig
from genome_lm.parallel import slab_bounds
from genome_lm.parallel.fsdp import sharded_numel
from genome_lm.parallel.layout import resolve_layout
from genome_lm.parallel.mesh import check_layout, default_device
from genome_lm.train.trainer import build_model, check_data, compute_dtype, make_stream, model_token_map, resolve_init

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def layout_lines(model: Glm5NextCausalLM, cfg, world: int) -> list[str]:
    """The per-rank shapes of `cfg`'s layout on `world` processes, as report lines."""
    dp, cp = resolve_layout(cfg.parallel.cp, cfg.parallel.dp, world)
    c, B, T = model.config, cfg.train.micro_batch, cfg.data.seq_len
    bounds = slab_bounds(T, cp)
    lengths = [b1 - b0 for b0, b1 in zip(bounds, bounds[1:])]
    slabs = ", ".join(f"{n:,} tokens x {k}" for n, k in Counter(lengths).items())
    total, per_rank, itemsize = _parameters(model, world)
    assert c.layer_types is not None  # the config fills it
    n_kda = c.layer_types.count("linear_attention")
    K, H = c.linear_head_dim, c.linear_num_heads
    ep, E, k = cfg.parallel.ep, c.n_routed_experts, c.num_experts_per_tok
    rows = B * max(lengths) * k
    experts = [f"  EP over groups of {ep} ranks ({world // ep} groups): {E // ep} of {E} routed experts per rank; each "
               f"MoE layer sends and receives {rows:,} token-expert rows x {c.hidden_size} per micro-batch "
               f"(all-to-all, {_gib(rows * c.hidden_size * itemsize)} each way, in blocks of "
               f"{cfg.memory.moe_block_tokens:,} tokens)"] if ep > 1 else []
    return [
        f"layout: {world} ranks = dp {dp} x cp {cp}; global batch {dp * B * cfg.train.grad_accum} sequences per step",
        f"  CP slabs per sequence: {slabs} (bounds {bounds if cp <= 8 else '...'})",
        f"  per rank: input_ids [{B}, {max(lengths):,}], layer input {[B, max(lengths), c.hc_mult, c.hidden_size]}",
        f"  KDA layers ({n_kda}): on CUDA fla's context parallelism (states exchanged inside its kernels), "
        f"elsewhere all-gather maps {[B, cp, H, K, 2 * K]} fp32; conv tails "
        f"{[B, cp * (c.linear_conv_kernel_dim - 1), 3 * H * K]}",
        f"  DSA layers ({len(c.layer_types) - n_kda}): all-gather latent {[B, T, c.kv_lora_rank]} and index keys "
        f"{[B, T, c.index_head_dim]}",
        *experts,
        f"  FSDP2 over {world} ranks"
        f"{f' (the EP experts over the {world // ep} ranks holding the same ones)' if ep > 1 else ''}: "
        f"{per_rank:,} of {total:,} parameters per rank "
        f"({_gib(per_rank * itemsize)} weights + {_gib(per_rank * _state_bytes(cfg, itemsize) * 2)} AdamW state); "
        "reduce-scatter in "
        f"{cfg.parallel.reduce_dtype}, backward prefetch {cfg.parallel.backward_prefetch} layer(s)",
    ]


def _parameters(model: nn.Module, world: int) -> tuple[int, int, int]:
    """(parameters of the model, parameters one rank holds once FSDP2 shards them, bytes per parameter)."""
    total = sum(p.numel() for p in model.parameters())
    per_rank = sum(sharded_numel(p.shape, world) for p in model.parameters()) if world > 1 else total
    return total, per_rank, next(model.parameters()).element_size()


def dry_run(cfg: ExperimentConfig, device: torch.device | None = None, world: int | None = None) -> int:
    """Check the experiment end to end without training: data, model on the meta device, token
    map, shapes, memory strategy, and the parallel layout on `world` processes through the run's
    own check (`mesh.check_layout`) with the per-rank shapes. Without `world`: cp x dp, or with
    `dp: auto` one replica of cp processes, which the summary says. Prints a summary; returns the
    number of processes checked."""
    from genome_lm.model import count_parameters, format_counts

    manifest = check_data(cfg)
    init = resolve_init(cfg, dry=True)
    model = build_model(cfg, device or default_device(), init, meta=True).model
    lut = model_token_map(cfg, manifest, model.config.vocab_size, init)
    stream = make_stream(cfg, lut)
    assumed = world is None
    if world is None:
        world = cfg.parallel.cp * (1 if cfg.parallel.dp == "auto" else int(cfg.parallel.dp))
    check_layout(cfg.parallel, world, model.config.n_routed_experts)
    B, T, c, m = cfg.train.micro_batch, cfg.data.seq_len, model.config, cfg.memory
    token_map = {sym: int(lut[i]) for sym, i in manifest["vocab"].items()}
    assert c.layer_types is not None  # the config fills it
    layers = {t: c.layer_types.count(t) for t in sorted(set(c.layer_types))}
    print("\n".join([
        f"experiment {cfg.name}: {cfg.model.name} ({cfg.model.dtype}), "
        f"init {cfg.model.init or 'preset initialisation'}",
        format_counts(count_parameters(model)),
        f"layers: {layers}",
        f"data: {cfg.data.shards}/{cfg.data.split}: {len(stream.pieces)} pieces, {stream.tokens_per_epoch:,} tokens "
        f"per epoch; token map {token_map}",
        f"per step: input_ids [{B}, {T:,}] x {cfg.train.grad_accum} micro-batches = "
        f"{B * T * cfg.train.grad_accum:,} tokens; layer input [{B}, {T:,}, {c.hc_mult}, {c.hidden_size}]",
        f"memory: recompute={m.recompute}{' ' + str(m.recompute_layers) if m.recompute == 'selective' else ''}, "
        f"offload_layer_inputs={m.offload_layer_inputs}"
        f"{f' (the last {m.offload_keep_last} kept on the device)' if m.offload_layer_inputs else ''}, "
        f"moe_block_tokens={m.moe_block_tokens}, dsa_block_queries={m.dsa_block_queries}, "
        f"loss_chunk_tokens={m.loss_chunk_tokens}, kda_head_block={m.kda_head_block or 'all'}",
        _precision_line(cfg, model),
        f"parallel: cp={cfg.parallel.cp}, dp={cfg.parallel.dp}, ep={cfg.parallel.ep}, checked on {world} "
        f"process{'es' if world > 1 else ''}"
        + (" (no --nproc: dp auto taken as 1; pass --nproc N to check the layout of N)"
           if assumed and cfg.parallel.dp == "auto" else ""),
        *layout_lines(model, cfg, world),
        _init_line(cfg, model, world),
        _checkpoint_line(cfg),
        "dry run OK: nothing was trained",
    ]))
    return world


def _precision_line(cfg: ExperimentConfig, model) -> str:
    """What training computes in and what the optimizer updates (`genome_lm.parallel.fsdp`)."""
    from genome_lm.parallel.fsdp import fp32_modules

    if compute_dtype(cfg) is None:
        return "precision: float32 parameters, compute and AdamW states (TF32 matmuls on CUDA: train.tf32)"
    groups = sum(len(fp32_modules(layer)) for layer in model.model.layers)
    states = cfg.train.optimizer_state_dtype
    per_param = 8 + 2 * _state_bytes(cfg, 4)
    return (f"precision: bf16 compute; float32 master weights and gradients, {states} AdamW moments, sharded by "
            f"FSDP2 ({per_param} bytes per parameter); upstream's float32 exceptions in {groups} float32 FSDP2 "
            "groups of their own (routers, conv1d, forget gates, hyper-connections); model/ exports in bf16")


def _state_bytes(cfg: ExperimentConfig, itemsize: int) -> int:
    """Bytes of one AdamW moment per parameter: the parameter's (float32 master) or bf16's."""
    return 2 if cfg.train.optimizer_state_dtype == "bfloat16" else itemsize


def _init_line(cfg: ExperimentConfig, model: nn.Module, world: int) -> str:
    """How the weights get onto the ranks, and the host memory that takes."""
    from genome_lm.model.presets import is_preset

    total, per_rank, itemsize = _parameters(model, world)
    whole, share = total * itemsize, per_rank * itemsize
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
