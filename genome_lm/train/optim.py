"""The optimizer and learning-rate schedule of a run: AdamW (weight decay on matrices only), linear warmup
then cosine decay to `min_lr_ratio` (or constant), and an AdamW with moments stored in
`train.optimizer_state_dtype` (docs/precision.md): torch AdamW's arithmetic in the same order (bit for bit
with float32 state), elementwise on each rank's local shard of a DTensor."""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from genome_lm.errors import GenomeLMError

BF16_MAX_BETA = 1 - 2**-7


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class AdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) with moments stored as `state_dtype`."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, state_dtype: torch.dtype = torch.float32):
        if state_dtype == torch.bfloat16 and max(betas) > BF16_MAX_BETA:
            raise GenomeLMError(
                f"train.betas {tuple(betas)} with train.optimizer_state_dtype: bfloat16: a bf16 moment rounds a "
                f"decay of 1 - beta < 2^-7 away; use betas <= {BF16_MAX_BETA:.4f} (e.g. [0.9, 0.95]) or "
                "optimizer_state_dtype: float32")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.state_dtype = state_dtype

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, which casts every moment to its parameter's dtype; cast back to `state_dtype`."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state and state[key].dtype != self.state_dtype:
                    state[key] = state[key].to(self.state_dtype)

    @torch.no_grad()
    def step(self, closure=None):  # no closure: the trainer steps after its own backward
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.state_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.state_dtype)
                state["step"] += 1
                step = state["step"].item()
                param, grad = _local(p), _local(p.grad)
                m_store, v_store = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
                m, v = m_store.to(param.dtype), v_store.to(param.dtype)  # the stored tensors, when of that dtype
                param.mul_(1 - lr * wd)
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = lr / (1 - beta1**step)
                denom = (v.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
                param.addcdiv_(m, denom, value=-step_size)
                if m is not m_store:
                    m_store.copy_(m)
                    v_store.copy_(v)


def make_scheduler(optimizer: torch.optim.Optimizer, train_cfg) -> torch.optim.lr_scheduler.LambdaLR:
    def fn(step: int) -> float:
        warmup, min_lr_ratio = train_cfg.warmup_steps, train_cfg.min_lr_ratio
        if warmup and step < warmup:
            return (step + 1) / warmup
        if train_cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, train_cfg.steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def make_optimizer(model: torch.nn.Module, train_cfg) -> torch.optim.Optimizer:
    """AdamW (torch's, or with bfloat16 state this module's). The routed experts' stacked weights are a group
    of their own: under EP they are DTensors on another mesh, which one foreach update cannot mix."""
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
