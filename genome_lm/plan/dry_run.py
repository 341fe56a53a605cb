"""The dry runs of `genome-lm train` and `genome-lm eval`: nothing is trained or scored, and the model is built
on the meta device (no weights read, no GPU needed).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from genome_lm.config import ExperimentConfig
from genome_lm.errors import GenomeLMError
from genome_lm.eval import sharded
from genome_lm.eval.config import resolve_dtype
from genome_lm.parallel import fp32_modules, sharded_numel, slab_bounds
from genome_lm.parallel.mesh import check_layout, default_device, resolve_layout
from genome_lm.train.trainer import build_model, check_data, compute_dtype, make_stream, model_token_map, resolve_init

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM

def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def layout_lines(model: Glm5NextCausalLM, cfg, world: int, params: tuple[int, int, int]) -> list[str]:
    """The per-rank shapes of `cfg`'s layout on `world` processes, as report lines. `params`: (parameters
    of the model, parameters one rank holds once FSDP2 shards them, bytes per parameter)."""
    dp, cp = resolve_layout(cfg.parallel.cp, cfg.parallel.dp, world)
    c, B, T = model.config, cfg.train.micro_batch, cfg.data.seq_len
    bounds = slab_bounds(T, cp)
    lengths = [b1 - b0 for b0, b1 in zip(bounds, bounds[1:])]
    slabs = ", ".join(f"{n:,} tokens x {k}" for n, k in Counter(lengths).items())
    total, per_rank, itemsize = params
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


def train_dry_run(cfg: ExperimentConfig, device: torch.device | None = None, world: int | None = None) -> int:
    """Check the experiment end to end without training and print what a run would do: data, model on
    the meta device, token map, shapes, memory strategy, and the parallel layout on `world` processes
    through the run's own check (`mesh.check_layout`) with the per-rank shapes. Without `world`: cp x dp,
    or with `dp: auto` one replica of cp processes. Returns the number of processes checked."""
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
    total = sum(p.numel() for p in model.parameters())
    params = (total, sum(sharded_numel(p.shape, world) for p in model.parameters()),  # world 1: the numel
              next(model.parameters()).element_size())
    B, T, c, m = cfg.train.micro_batch, cfg.data.seq_len, model.config, cfg.memory
    token_map = {sym: int(lut[i]) for sym, i in manifest["vocab"].items()}
    assert c.layer_types is not None  # the config fills it
    layers = {t: c.layer_types.count(t) for t in sorted(set(c.layer_types))}
    # what training computes in and what the optimizer updates (`genome_lm.parallel`)
    precision = "precision: float32 parameters, compute and AdamW states (TF32 matmuls on CUDA: train.tf32)"
    if compute_dtype(cfg) is not None:
        groups = sum(len(fp32_modules(layer)) for layer in model.model.layers)
        precision = (f"precision: bf16 compute; float32 master weights and gradients, "
                     f"{cfg.train.optimizer_state_dtype} AdamW moments, sharded by FSDP2 "
                     f"({8 + 2 * _state_bytes(cfg, 4)} bytes per parameter); "
                     f"upstream's float32 exceptions in {groups} float32 FSDP2 groups of their own (routers, conv1d, "
                     "forget gates, hyper-connections); model/ exports in bf16")
    export = {True: "at every checkpoint", "last": "at the last checkpoint only", False: "never"}
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
        precision,
        f"parallel: cp={cfg.parallel.cp}, dp={cfg.parallel.dp}, ep={cfg.parallel.ep}, checked on {world} "
        f"process{'es' if world > 1 else ''}"
        + (" (no --nproc: dp auto taken as 1; pass --nproc N to check the layout of N)"
           if assumed and cfg.parallel.dp == "auto" else ""),
        *layout_lines(model, cfg, world, params),
        _init_line(cfg, world, params),
        f"checkpoints: every {cfg.train.checkpoint_every} steps, train_state/ (DCP); model/ (Hugging Face weights, "
        f"streamed one tensor at a time) {export[cfg.train.export_model]}"
        + ("" if cfg.train.export_model is True else "; `genome-lm export CHECKPOINT --out DIR` writes it later"),
        "dry run OK: nothing was trained",
    ]))
    return world


def _state_bytes(cfg: ExperimentConfig, itemsize: int) -> int:
    """Bytes of one AdamW moment per parameter: the parameter's (float32 master) or bf16's."""
    return 2 if cfg.train.optimizer_state_dtype == "bfloat16" else itemsize


def _init_line(cfg: ExperimentConfig, world: int, params: tuple[int, int, int]) -> str:
    """How the weights get onto the ranks, and the host memory that takes (`params` as `layout_lines`)."""
    from genome_lm.model.presets import PRESETS

    total, per_rank, itemsize = params
    whole, share = total * itemsize, per_rank * itemsize
    source = f"model.init {cfg.model.init}" if cfg.model.init else (
        "preset initialisation" if cfg.model.name in PRESETS else f"weights of {cfg.model.name}")
    if world == 1:
        return f"init: {source}; one process holds the whole model ({_gib(whole)})"
    if cfg.model.init or cfg.model.name not in PRESETS:
        return (f"init: {source}; built on the meta device, sharded, then each of the {world} ranks reads only its "
                f"rows of each tensor from the safetensors files ({_gib(share)} of weights per rank)")
    return (f"init: {source}; each of the {world} ranks first builds the whole model on CPU ({_gib(whole)}), then "
            f"keeps its shards ({_gib(share)})")


LABELS = {
    "root_gathered": "root gathered (embeddings, final norm, LM head)",
    "layer_gathered": "decoder layers gathered (running + prefetched)",
    "streams": "residual streams (layer input + output)",
    "op": "largest op (its tensors + transient)",
    "final": "final hidden state + norm",
    "loss_chunk": "LM head chunk (logits, float32)",
    "per_token_nll": "per-token NLL of the piece",
    "input_ids": "input ids + labels",
}


def _size(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _n(k: int, what: str) -> str:
    return f"{k:,} {what}{'' if k == 1 else 's'}"


def _windows(cfg, source: str) -> tuple[np.ndarray, str]:
    """Lengths [W] of the windows to score, and where they come from."""
    if not cfg.shards:
        if cfg.seq_len is None:
            raise GenomeLMError("--dry-run without --shards plans one window of --seq-len tokens; give it, "
                                "e.g. --seq-len 1M")
        return np.array([cfg.seq_len], dtype=np.int64), "--seq-len, no --shards"
    from genome_lm.eval.run import scored_windows
    from genome_lm.model import token_map

    manifest, _, _, lengths = scored_windows(cfg)
    token_map(manifest["vocab"], source)
    return lengths, f"{cfg.shards}/{cfg.split}"


def eval_dry_run(cfg, world: int | None = None) -> None:
    """Check `cfg` for `world` processes (default --cp) and print the memory each rank needs:
    `plan_forward`'s parts for one slab of the longest piece (or of one --seq-len window without
    --shards), on GPUs unless `--device cpu`."""
    from genome_lm.config import BlockSizes, MemoryConfig
    from genome_lm.eval.ablation import plan as ablation_targets
    from genome_lm.model.presets import PRESETS
    from genome_lm.plan.hardware import GPUS, Assumptions
    from genome_lm.plan.layout import Layout
    from genome_lm.plan.memory import plan_forward
    from genome_lm.plan.shapes import model_shape
    from genome_lm.train.checkpoint import resolve_model_dir

    world = world or cfg.cp
    dp, cp = sharded.check(cfg, world)
    if cfg.out and Path(cfg.out).exists() and not cfg.overwrite:
        raise GenomeLMError(f"--out {cfg.out} already exists; pass --overwrite to replace it or choose another --out")
    device = torch.device(cfg.device or "cuda")
    gpu = device.type == "cuda"
    dtype = resolve_dtype(cfg.dtype, device)
    source = cfg.checkpoint  # a preset name as is, a checkpoint as its model directory
    if source not in PRESETS:
        if not Path(source).exists():
            raise GenomeLMError(f"--checkpoint {source} does not exist; point it to a run's checkpoints/last, a model "
                                "directory, or (for --dry-run) a preset such as glm53-flash")
        source = str(resolve_model_dir(source))
    lengths, where = _windows(cfg, source)
    seq_len = int(cfg.seq_len or lengths.max())
    piece = int(min(seq_len, lengths.max()))
    sharded.check_pieces(lengths, seq_len, cp)
    shape = model_shape(source, dtype)
    blocks = MemoryConfig(**cfg.model_dump(include=set(BlockSizes.model_fields)), moe_recompute=True)  # eval's
    layout = Layout(piece, blocks).replace(cp=cp, dp=dp)
    assume = Assumptions()
    fla = cfg.kda_backend == "fla" or (cfg.kda_backend == "auto" and gpu)
    plan = plan_forward(shape, layout, assume, backend="fla" if fla else "torch")
    counts = Counter(np.diff(slab_bounds(piece, cp)).tolist())
    pieces = sum(sharded.n_pieces(n, seq_len) for n in lengths)
    rounds = -(-len(lengths) // dp)
    print(f"eval dry run: {source} ({dtype}), {shape.counts['total']:,} parameters = {_size(shape.param_bytes)}")
    print(f"windows ({where}): {_n(len(lengths), 'window')}, {int(lengths.sum()):,} tokens, scored in "
          f"{_n(pieces, 'piece')} of up to {piece:,} tokens")
    print(f"layout: {world} {'GPUs' if gpu else 'CPU processes'} = dp {dp} x cp {cp}: {_n(dp, 'window')} at a time "
          f"({_n(rounds, 'round')}); "
          "each piece in CP slabs of " + ", ".join(f"{n:,} tokens x {k}" for n, k in counts.items()))
    # tokens run forward: the windows, their reverse complements (--strands both) and the context ablation's
    # sum over L of (L + n) per window taking part (n: its targets as the eval plans them, 0 if it takes none)
    windows = int(lengths.sum())
    reverse, ablation = windows if cfg.strands == "both" else 0, 0
    if cfg.context:
        n = ablation_targets(lengths, cfg.context, cfg.ablation_targets, cfg.seq_len, cp)
        ablation = int(len(cfg.context) * n.sum() + sum(cfg.context) * (n > 0).sum())
    if reverse + ablation:
        total = windows + reverse + ablation
        print(f"forward passes: {total:,} tokens in all, {total / windows:.2f}x the windows' (windows {windows:,}, "
              f"reverse complements {reverse:,}, context ablation {ablation:,}); time grows with it, memory per "
              "forward does not")
    print("memory per rank (estimate: forward only, no gradients):")
    share = f"FSDP2 shard, 1/{world}" if world > 1 else "whole model, one process"
    for key, label in {"weights": f"weights ({share})", **LABELS}.items():  # the weights: never 0
        if key in plan.breakdown:
            print(f"  {label:<50} {_size(plan.breakdown[key]):>12}")
    print(f"  {'peak':<50} {_size(plan.peak_bytes):>12}   at {plan.peak_where}")
    if gpu:
        need = plan.peak_bytes * (1 + assume.fragmentation) + assume.runtime_reserved_gib * 2**30
        fits = ", ".join(f"{g.name} ({_size(g.memory_bytes)})" for g in GPUS.values() if need <= g.memory_bytes)
        small = ", ".join(f"{g.name} ({_size(g.memory_bytes)})" for g in GPUS.values() if need > g.memory_bytes)
        verdict = (f"fits {fits}" + (f"; too large for {small}" if small else "") if fits else
                   f"too large for every GPU listed ({small}): use more processes (--nproc) or a larger --cp")
        print(f"  with {assume.fragmentation:.0%} allocator overhead + {assume.runtime_reserved_gib:g} GiB runtime: "
              f"{_size(need)}; {verdict}")
    print("dry run OK: nothing was scored")
