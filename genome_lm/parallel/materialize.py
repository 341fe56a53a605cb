"""Weights into a model whose parameters may be FSDP2 shards, one tensor at a time.

    load_weights_(model, ckpt_dir)                 # plain or sharded model, weights from safetensors
    materialize_(model, device, ckpt_dir)          # distributed: after parallelize() on the meta device
    materialize_(model, device, reference=full)    # distributed, from scratch: shards of a full model

A sharded parameter (DTensor, FSDP2 `Shard(0)`) holds rows `[start, start + n)` of the full
tensor on this rank (`local_rows`); each rank reads exactly those rows from the checkpoint
(`CheckpointReader.rows`: `safe_open(...).get_slice(key)[start:stop]`, per-expert tensors for
the experts it owns), so no rank ever holds a full copy of the model. Host memory beyond the
model's own shards: the rows being copied (at most one tensor's share; a whole tensor for a
plain model). Buffers (`mlp.gate.e_score_correction_bias`) are replicated and read whole.

`materialize_` allocates the shards of a model built on the meta device (`to_empty`) and fills
them. `to_empty` leaves every tensor uninitialised: parameters and persistent buffers are all in
the state dict and are filled from the source; the model has no non-persistent buffers (checked:
one would be lost, so `materialize_` refuses a model that has one).
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import torch
from torch import nn

from genome_lm.errors import GenomeLMError
from genome_lm.model.checkpoint import model_tensors
from genome_lm.model.load import cast_tensor

log = logging.getLogger(__name__)

ReadRows = Callable[[str, tuple[int, ...], int, int], torch.Tensor]  # (name, full shape, start, stop) -> rows


def local_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the part of `tensor` this rank holds, its first row in the full tensor); (tensor, 0) for a
    plain tensor. Sharded tensors must be split on dim 0 only (FSDP2's `Shard(0)`)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(tensor, DTensor):
        return tensor, 0
    if not all(isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim == 0) for p in tensor.placements):
        raise ValueError(f"local_rows: only dim-0 sharding is supported, got {tensor.placements}")
    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return tensor.to_local(), int(offset[0]) if offset else 0


@torch.no_grad()
def copy_rows_(model: nn.Module, read: ReadRows) -> None:
    """Fill every tensor of `model.state_dict()` (parameters and buffers) with the rows this rank
    holds, `read(name, full_shape, start, stop)` giving them; one tensor at a time. A tied
    `lm_head.weight` is the embedding and is skipped. The rows are first rounded to the dtype the
    model was built in (`model.config.dtype`, upstream's float32 exceptions kept), so float32
    master weights of a bf16 model hold what one process's bf16 model holds."""
    built = getattr(getattr(model, "config", None), "dtype", None)
    built = built if isinstance(built, torch.dtype) else None
    for name, tensor in model_tensors(model, model.state_dict(keep_vars=True)).items():
        local, start = local_rows(tensor)
        if local.dim() == 0:
            raise ValueError(f"copy_rows_: {name} is a scalar; the model has none")
        if local.shape[0] == 0:
            continue  # this rank holds no rows of a tensor shorter than the world
        rows = cast_tensor(name, read(name, tuple(tensor.shape), start, start + local.shape[0]), built)
        if rows.shape != local.shape:
            raise GenomeLMError(f"model: {name}: got rows of shape {tuple(rows.shape)}, expected "
                                f"{tuple(local.shape)}; the checkpoint does not match the model's config")
        local.copy_(rows)


def load_weights_(model: nn.Module, ckpt_dir: str | os.PathLike) -> None:
    """Copy the text weights of the model directory `ckpt_dir` into `model` (plain, or sharded: each
    rank reads its rows), exactly (cast to each parameter's dtype). Missing weights and shapes
    that do not match are GenomeLMErrors, found before anything is read; checkpoint weights the
    model has no place for are logged."""
    from genome_lm.model.load import CheckpointReader

    with CheckpointReader(ckpt_dir, model.config) as reader:
        unused = reader.check({name: tuple(t.shape) for name, t in model_tensors(model).items()})
        copy_rows_(model, reader.rows)
    if unused:
        log.warning("%s: %d weights not used by the model, e.g. %s", ckpt_dir, len(unused), unused[:5])


def non_persistent_buffers(model: nn.Module) -> list[str]:
    return [f"{prefix}.{name}".lstrip(".") for prefix, module in model.named_modules()
            for name in module._non_persistent_buffers_set]


def materialize_(model: nn.Module, device: torch.device, weights: str | os.PathLike | None = None,
                 reference: nn.Module | None = None) -> nn.Module:
    """Allocate the (sharded) tensors of `model`, built on the meta device and parallelized, on
    `device` and fill them: from the model directory `weights` (each rank reads its rows) or from
    the full tensors of `reference` (a plain model with the same state dict keys)."""
    if (weights is None) == (reference is None):
        raise ValueError("materialize_: give exactly one of weights, reference")
    if lost := non_persistent_buffers(model):
        raise NotImplementedError(f"materialize_: non-persistent buffers {lost[:3]} would be left uninitialised by "
                                  "to_empty; recompute them here")
    model.to_empty(device=device)
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False) and model.lm_head.weight is not model.model.embed_tokens.weight:
        raise GenomeLMError("model: tie_word_embeddings is not supported in distributed runs; set "
                            "model.overrides.tie_word_embeddings: false")
    if weights is not None:
        load_weights_(model, weights)
    else:
        state = reference.state_dict()
        copy_rows_(model, lambda name, shape, start, stop: state[name][start:stop])
    return model
