"""Learning-rate schedule: linear warmup, then cosine decay to `min_lr_ratio`, or constant."""

from __future__ import annotations

import math

import torch

from genome_lm.train.optim import AdamW


def lr_lambda(step: int, *, steps: int, warmup: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the base lr for optimizer step `step` (0-based)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(optimizer: torch.optim.Optimizer, train_cfg) -> torch.optim.lr_scheduler.LambdaLR:
    def fn(step: int) -> float:
        return lr_lambda(step, steps=train_cfg.steps, warmup=train_cfg.warmup_steps,
                         schedule=train_cfg.schedule, min_lr_ratio=train_cfg.min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def make_optimizer(model: torch.nn.Module, train_cfg) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, biases, gates and other vectors). The
    routed experts' stacked weights are a group of their own, whatever the layout: with expert
    parallelism they are DTensors on another mesh, which one foreach update cannot mix.
    `train_cfg.optimizer_state_dtype`: float32 -> torch's AdamW; bfloat16 -> `optim.AdamW` with
    bf16 moments (same update arithmetic)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    experts: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            routed = name.endswith(("experts.gate_up_proj", "experts.down_proj"))
            (experts if routed else decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": train_cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if experts:
        groups.append({"params": experts, "weight_decay": train_cfg.weight_decay})
    kw = dict(lr=train_cfg.lr, betas=tuple(train_cfg.betas), eps=train_cfg.eps)
    if train_cfg.optimizer_state_dtype == "bfloat16":
        return AdamW(groups, state_dtype=torch.bfloat16, **kw)
    return torch.optim.AdamW(groups, **kw)
