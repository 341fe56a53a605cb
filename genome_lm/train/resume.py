"""What `train --resume` takes from a new config, and what it refuses.

The run directory's `config.yaml` is the config its checkpoints were trained with. A resumed run
compares it with the new one key by key:

- keys that do not change what is computed (`TAKEN`: how long to train, how often to checkpoint,
  logging, memory strategies and block sizes, the process layout) are taken, logged, and the
  earlier `config.yaml` is kept as `config.resume-N.yaml`;
- `train.micro_batch` and `train.grad_accum` are taken when the sequences per optimizer step
  (micro_batch x grad_accum x dp, recorded in the run's marker) stay the same: a run started on
  2 processes of micro_batch 1 resumes on one of micro_batch 2;
- every other key (data, model, optimizer, schedule, seeds, precision) is refused in one line
  naming each key, old -> new: the checkpoint's optimizer state and schedule position were made
  with the old values, so a silent change would train neither run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from genome_lm.config import ExperimentConfig, dump_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.options import read_yaml

log = logging.getLogger(__name__)

# Dotted keys (or section prefixes ending in ".") a resume may change.
TAKEN = (
    "name", "train.steps", "train.checkpoint_every", "train.keep_checkpoints", "train.export_model",
    "train.on_nonfinite", "train.checkpoint_mode", "train.on_disk_full", "train.preempt_signals", "log.", "memory.",
    "parallel.dp", "parallel.cp", "parallel.ep", "parallel.backward_prefetch", "parallel.timeout",
    "parallel.watchdog_factor", "parallel.watchdog_min_s",
)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and tuples stay values."""
    if not isinstance(tree, dict):
        return {prefix.removesuffix("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}."))
    return flat


def changes(stored: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every dotted key whose value differs, in the new config's order."""
    old, cur = flatten(stored), flatten(new)
    keys = list(cur) + [k for k in old if k not in cur]
    return [(k, old.get(k), cur.get(k)) for k in keys if _norm(old.get(k)) != _norm(cur.get(k))]


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def taken(key: str) -> bool:
    return any(key == t or (t.endswith(".") and key.startswith(t)) for t in TAKEN)


def _stored_config(path: Path) -> dict:
    """config.yaml as the resolved config it was written from (the YAML itself if it no longer validates)."""
    try:
        raw = read_yaml(path, "data, model, train, ...")
    except GenomeLMError as e:
        raise GenomeLMError(f"--resume: {e}; it records the settings the run's checkpoints were trained with: "
                            "restore it, or train into a new --out") from None
    try:
        return ExperimentConfig.model_validate(raw).model_dump(mode="json")
    except ValueError:
        return raw


BATCH_KEYS = ("train.micro_batch", "train.grad_accum")


def accept_resume(run_dir: Path, cfg: ExperimentConfig, per_step: int, stored_per_step: int | None) -> list:
    """Compare `cfg` with `run_dir/config.yaml`; raise `GenomeLMError` on a refused change, else return
    the accepted changes [(key, old, new)] for `record_resume`. Writes nothing.
    `per_step` / `stored_per_step`: sequences per optimizer step now and when the run started (None:
    not recorded, so a batch key may not change)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise GenomeLMError(f"--resume: {path} is missing; it records the settings {run_dir}'s checkpoints were "
                            "trained with, which --resume compares with the new ones key by key: restore it, or "
                            "train into a new --out")
    found = changes(_stored_config(path), cfg.model_dump(mode="json"))
    same_batch = stored_per_step is not None and stored_per_step == per_step
    refused = [c for c in found if not (taken(c[0]) or (c[0] in BATCH_KEYS and same_batch))]
    if any(c[0] in BATCH_KEYS for c in refused) and stored_per_step is not None:
        refused.append(("sequences per step", stored_per_step, per_step))
    if refused:
        listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in refused)
        raise GenomeLMError(
            f"--resume: {run_dir} was trained with other settings ({listed}); its checkpoints' optimizer state, "
            f"schedule and data position belong to {path}: resume with that config (--set only steps, checkpoints, "
            "logging, memory or layout keys), or train into a new --out"
        )
    return found


def record_resume(run_dir: Path, cfg: ExperimentConfig, found: list) -> None:
    """Once a resumed run has loaded its checkpoint: keep the earlier config as `config.resume-N.yaml`
    when anything changed (`found`, from `accept_resume`), and write the new one as config.yaml."""
    path = run_dir / "config.yaml"
    if found:
        n = 1 + sum(1 for _ in run_dir.glob("config.resume-*.yaml"))
        path.rename(run_dir / f"config.resume-{n}.yaml")
        log.info("--resume takes %s (the earlier config is config.resume-%d.yaml)",
                 ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in found), n)
    path.write_text(dump_experiment(cfg))
