"""`genome-lm eval --dry-run`: check an eval and print the memory each rank needs; nothing is scored.

    genome-lm eval --checkpoint $GLM53_FLASH_DIR --shards shards/hg38_512k --out evals/base \
        --nproc 64 --cp 8 --dry-run                                   # the command to run, checked
    genome-lm eval --checkpoint glm53-flash --seq-len 1M --nproc 64 --cp 8 --dry-run   # no shards

The model is built on the meta device (a checkpoint's config.json, or a preset), so no weights
are read and no GPU is needed. It plans GPUs (`--device cpu` plans CPU processes), in bfloat16
unless `--dtype` says otherwise. Per rank (`plan.inference.plan_forward`, the planner's byte
counts): the FSDP2 shard of the weights, the parameters FSDP2 gathers (root for the whole
forward, the running and prefetched layers), and the activations of one slab of the longest
piece (residual streams, the largest op, the LM head chunk, the gathered per-token NLL). Without
--shards it plans one window of --seq-len tokens.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch

from genome_lm.errors import GenomeLMError
from genome_lm.eval import sharded
from genome_lm.eval.config import resolve_dtype

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


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _n(k: int, what: str) -> str:
    return f"{k:,} {what}{'' if k == 1 else 's'}"


def model_source(checkpoint: str) -> str:
    """A preset name as is, a checkpoint as its model directory."""
    from genome_lm.model.presets import is_preset
    from genome_lm.train.checkpoint import resolve_model_dir

    if is_preset(checkpoint):
        return checkpoint
    if not Path(checkpoint).exists():
        raise GenomeLMError(f"--checkpoint {checkpoint} does not exist; point it to a run's checkpoints/last, a model "
                            "directory, or (for --dry-run) a preset such as glm53-flash")
    return str(resolve_model_dir(checkpoint))


def _windows(cfg, source: str) -> tuple[np.ndarray, str]:
    """Lengths [W] of the windows to score, and where they come from."""
    if not cfg.shards:
        if cfg.seq_len is None:
            raise GenomeLMError("--dry-run without --shards plans one window of --seq-len tokens; give it, "
                                "e.g. --seq-len 1M")
        return np.array([cfg.seq_len], dtype=np.int64), "--seq-len, no --shards"
    from genome_lm.eval.run import _inputs, window_lengths
    from genome_lm.model import token_map

    manifest, ds = _inputs(cfg)
    token_map(manifest["vocab"], source)
    return window_lengths(ds, cfg.max_windows, cfg.window_pick), f"{cfg.shards}/{cfg.split}"


def forward_tokens(cfg, lengths: np.ndarray) -> dict:
    """Tokens the eval runs forward: the windows [W], their reverse complements (--strands both) and
    the context ablation's sum over L of (L + n) per window taking part (eval/ablation.py's rule:
    n = --ablation-targets or length // 8, windows with length - n >= max L)."""
    out = {"windows": int(lengths.sum()), "reverse": int(lengths.sum()) if cfg.strands == "both" else 0,
           "ablation": 0}
    if cfg.context:
        n = np.full_like(lengths, cfg.ablation_targets) if cfg.ablation_targets else lengths // 8
        part = (lengths - n) >= max(cfg.context)
        out["ablation"] = int(len(cfg.context) * n[part].sum() + sum(cfg.context) * part.sum())
    out["total"] = out["windows"] + out["reverse"] + out["ablation"]
    return out


def dry_run(cfg, world: int | None = None) -> dict:
    """Check `cfg` for `world` processes (default --cp) and print the memory per rank; return it."""
    from genome_lm.config import BlockSizes, MemoryConfig
    from genome_lm.parallel import slab_bounds
    from genome_lm.plan import GPUS, Assumptions, Layout, model_shape
    from genome_lm.plan.inference import plan_forward

    world = world or cfg.cp
    dp, cp = sharded.check(cfg, world)
    if cfg.out and Path(cfg.out).exists() and not cfg.overwrite:
        raise GenomeLMError(f"--out {cfg.out} already exists; pass --overwrite to replace it or choose another --out")
    device = torch.device(cfg.device or "cuda")
    gpu = device.type == "cuda"
    dtype = resolve_dtype(cfg.dtype, device)
    source = model_source(cfg.checkpoint)
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
    need = plan.peak_bytes * (1 + assume.fragmentation) + assume.runtime_reserved_gib * 2**30
    fits = [g for g in GPUS.values() if need <= g.memory_bytes]
    small = [g for g in GPUS.values() if need > g.memory_bytes]
    slabs = slab_bounds(piece, cp)
    counts = Counter(b - a for a, b in zip(slabs, slabs[1:]))
    pieces = sum(sharded.n_pieces(n, seq_len) for n in lengths)
    rounds = -(-len(lengths) // dp)
    summary = {"model": source, "dtype": dtype, "world": world, "dp": dp, "cp": cp, "device": device.type,
               "windows": len(lengths), "tokens": int(lengths.sum()), "pieces": pieces, "piece_tokens": piece,
               "slab_tokens": sorted(counts), "rounds": rounds, "parameter_bytes": shape.param_bytes,
               "peak_bytes_per_rank": plan.peak_bytes, "peak_where": plan.peak_where, "breakdown": plan.breakdown,
               "fits": [g.name for g in fits]}
    kind = "GPUs" if gpu else "CPU processes"
    print(f"eval dry run: {source} ({dtype}), {shape.counts['total']:,} parameters = {_gib(shape.param_bytes)}")
    print(f"windows ({where}): {_n(len(lengths), 'window')}, {int(lengths.sum()):,} tokens, scored in "
          f"{_n(pieces, 'piece')} of up to {piece:,} tokens")
    print(f"layout: {world} {kind} = dp {dp} x cp {cp}: {_n(dp, 'window')} at a time "
          f"({_n(rounds, 'round')}); "
          "each piece in CP slabs of " + ", ".join(f"{n:,} tokens x {k}" for n, k in counts.items()))
    work = forward_tokens(cfg, lengths)
    summary["forward_tokens"] = work
    if work["total"] != work["windows"]:
        print(f"forward passes: {work['total']:,} tokens in all, {work['total'] / work['windows']:.2f}x the windows' "
              f"(windows {work['windows']:,}, reverse complements {work['reverse']:,}, context ablation "
              f"{work['ablation']:,}); time grows with it, memory per forward does not")
    print("memory per rank (estimate: forward only, no gradients):")
    share = f"FSDP2 shard, 1/{world}" if world > 1 else "whole model, one process"
    print(f"  {'weights (' + share + ')':<50} {_gib(plan.breakdown['weights']):>12}")
    for key, label in LABELS.items():
        if key in plan.breakdown:
            print(f"  {label:<50} {_gib(plan.breakdown[key]):>12}")
    print(f"  {'peak':<50} {_gib(plan.peak_bytes):>12}   at {plan.peak_where}")
    if gpu:
        def gpus(specs) -> str:
            return ", ".join(f"{g.name} ({_gib(g.memory_bytes)})" for g in specs)

        verdict = (f"fits {gpus(fits)}" + (f"; too large for {gpus(small)}" if small else "") if fits else
                   f"too large for every GPU listed ({gpus(small)}): use more processes (--nproc) or a larger --cp")
        print(f"  with {assume.fragmentation:.0%} allocator overhead + {assume.runtime_reserved_gib:g} GiB runtime: "
              f"{_gib(need)}; {verdict}")
    print("dry run OK: nothing was scored")
    return summary
