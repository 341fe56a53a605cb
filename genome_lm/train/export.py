"""`genome-lm export RUN/checkpoints/step_N --out DIR`: a checkpoint's `train_state/` (DCP) as the model
directory its `model/` would be, byte for byte. One process, no GPU: the model built on the meta device from
`RUN/config.yaml`, tensors read from DCP in batches of at most `max_shard_bytes` and streamed through
`save_pretrained`'s writer (memory: about two output files, whatever the model's size)."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Iterator

import torch
from torch.distributed.checkpoint.api import CheckpointException

from genome_lm.errors import GenomeLMError
from genome_lm.model.weights.layout import TensorSpec, model_tensors
from genome_lm.model.weights.writer import DEFAULT_MAX_SHARD_BYTES, byte_batches, write_model_dir

log = logging.getLogger(__name__)


def _dcp_tensors(state_dir: Path, specs: list[TensorSpec], batch_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, tensor)` in the order of `specs` from DCP keys `model.NAME`, `batch_bytes` at a time."""
    import torch.distributed.checkpoint as dcp

    for batch in byte_batches(specs, lambda spec: torch.Size(spec[1]).numel() * spec[2].itemsize, batch_bytes):
        state = {"model": {name: torch.empty(shape, dtype=dtype) for name, shape, dtype in batch}}
        with warnings.catch_warnings(action="ignore"):  # "no process group: loading in a single process"
            dcp.load(state, checkpoint_id=str(state_dir))
        loaded = state.pop("model")
        for name, _, _ in batch:
            yield name, loaded.pop(name)


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False,
                      max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Write the model directory of training checkpoint `checkpoint` to `out` (atomically); return `out`."""
    from genome_lm.config import load_experiment
    from genome_lm.train.checkpoint import DamagedCheckpoint, check_train_state
    from genome_lm.train.trainer import build_model

    ckpt = Path(checkpoint)
    state_dir = ckpt / "train_state"
    if not (state_dir / ".metadata").is_file():
        raise GenomeLMError(f"{ckpt} is not a training checkpoint (no train_state/.metadata); point to "
                            "RUN/checkpoints/step_N or RUN/checkpoints/last")
    config_path = ckpt.resolve().parent.parent / "config.yaml"
    if not config_path.is_file():
        raise GenomeLMError(f"{config_path} not found: export reads the model from the run's config.yaml; keep the "
                            "checkpoint inside its run directory (RUN/checkpoints/step_N)")
    try:
        stored = check_train_state(state_dir)
    except DamagedCheckpoint as e:
        raise GenomeLMError(f"{state_dir} is damaged ({e}); export an earlier checkpoint of the run "
                            f"({ckpt.resolve().parent}/step_N)") from None
    cfg = load_experiment(config_path)
    built = build_model(cfg, torch.device("cpu"), None, meta=True)
    model = built.model
    tensors = model_tensors(model)
    for name, tensor in tensors.items():
        meta = stored.get(f"model.{name}")
        if meta is None or not hasattr(meta, "size"):
            raise GenomeLMError(f"{state_dir} lacks the weight model.{name} of the model in {config_path}; is it a "
                                "checkpoint of this run?")
        if tuple(meta.size) != tuple(tensor.shape):
            raise GenomeLMError(f"{state_dir}: model.{name} has shape {tuple(meta.size)}, the model in {config_path} "
                                f"has {tuple(tensor.shape)}; is it a checkpoint of this run?")
    # read as stored (a bf16 model's float32 master weights), written in the model's dtype
    specs = [(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
    read = [(name, shape, stored[f"model.{name}"].properties.dtype) for name, shape, _ in specs]
    loaded = ((name, t.to(tensors[name].dtype)) for name, t in _dcp_tensors(state_dir, read, max_shard_bytes))
    try:
        write_model_dir(model, out, specs, loaded, overwrite=overwrite, max_shard_bytes=max_shard_bytes,
                        inputs=[ckpt], tokenizer_from=built.source)
    except (RuntimeError, ValueError, CheckpointException) as e:  # a truncated or garbled train_state file
        why = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
        raise GenomeLMError(f"{state_dir} is damaged ({why}); export an earlier checkpoint of the run "
                            f"({ckpt.resolve().parent}/step_N)") from None
    log.info("exported %s (%d tensors) -> %s", ckpt, len(specs), out)
    return Path(out)


def export_command(p) -> str:
    """`genome-lm export`: `p` its ExportParams."""
    return f"export: {export_checkpoint(p.checkpoint, p.out, overwrite=p.overwrite, max_shard_bytes=p.max_shard_size)}"
