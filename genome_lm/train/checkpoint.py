"""Training checkpoints: weights as a Hugging Face-style directory, the rest through DCP.

    RUN/checkpoints/
      step_00000100/
        model/          config.json + model.safetensors (transformers and `genome-lm eval` load it)
        train_state/    torch.distributed.checkpoint: optimizer, scheduler, data position, RNG
        genome_lm.json  step, loss, time
      last -> step_00000100

A checkpoint is written under a hidden temporary name and renamed when complete, then `last`
is switched atomically; only complete checkpoints ever carry a `step_*` name. The newest
`keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from genome_lm.errors import GenomeLMError
from genome_lm.utils import make_temp_dir

log = logging.getLogger(__name__)
STEP_RE = re.compile(r"^step_(\d{8})$")


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A training checkpoint (`.../step_N` or `.../last`) -> its `model/`; a model directory as is."""
    p = Path(path)
    if (p / "model" / "config.json").exists():
        return p / "model"
    if (p / "config.json").exists():
        return p
    raise GenomeLMError(f"{p} is not a model checkpoint (no config.json, nor model/config.json); "
                        "point to a run's checkpoints/last or a Hugging Face model directory")


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_RE.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1][1] if found else None


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.stack([s for s in torch.cuda.get_rng_state_all()])
    return state


def _train_state(model, optimizer, scheduler, data, step: int) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optim = get_optimizer_state_dict(model, optimizer)
    return {
        "optimizer": optim,
        "scheduler": scheduler.state_dict(),
        "data": data.state_dict(),
        "rng": _rng_state(),
        "step": step,
    }


def save_checkpoint(ckpt_dir: Path, step: int, model, optimizer, scheduler, data, info: dict, keep: int) -> Path:
    from genome_lm.model import save_pretrained

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:08d}"
    tmp = make_temp_dir(ckpt_dir, f".{final.name}.partial-")
    try:
        save_pretrained(model, tmp / "model")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(_train_state(model, optimizer, scheduler, data, step), checkpoint_id=str(tmp / "train_state"))
        (tmp / "genome_lm.json").write_text(json.dumps({"step": step, "time": time.time(), **info}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    link_tmp = ckpt_dir / f".last.{os.getpid()}"
    link_tmp.unlink(missing_ok=True)
    link_tmp.symlink_to(final.name)
    os.replace(link_tmp, ckpt_dir / "last")
    for _, old in list_checkpoints(ckpt_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint step %d -> %s", step, final)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler, data) -> int:
    """Restore weights, optimizer, scheduler, data position and RNG from `path`; return its step."""
    load_weights(model, path)
    state = _train_state(model, optimizer, scheduler, data, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # partial: parameters that never received a gradient (e.g. upstream's indexer, trained
        # without gradients) have no optimizer state in the checkpoint; the fresh one is unused.
        dcp.load(state, checkpoint_id=str(path / "train_state"), planner=DefaultLoadPlanner(allow_partial_load=True))
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    data.load_state_dict(state["data"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["rng"]["cuda"]))
    return int(state["step"])


def load_weights(model, path: str | os.PathLike) -> None:
    """Copy the weights of a checkpoint (training or model directory) into `model`, exactly."""
    from genome_lm.model import build

    loaded = build(resolve_model_dir(path), dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        model.load_state_dict(loaded.state_dict(), strict=True)


def clean_partials(ckpt_dir: Path) -> None:
    """Remove checkpoints a killed run left half-written (hidden `.step_*.partial-*` dirs)."""
    if ckpt_dir.is_dir():
        for p in ckpt_dir.glob(".step_*.partial-*"):
            shutil.rmtree(p, ignore_errors=True)
