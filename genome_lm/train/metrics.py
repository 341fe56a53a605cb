"""Per-step metrics: `metrics.jsonl` in the run directory and wandb, and the step's peak memory (GPU:
`max_memory_allocated`; CPU: VmHWM, reset through /proc/self/clear_refs where the kernel allows it)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Literal

import torch

log = logging.getLogger(__name__)


def proc_status_kb(field: str) -> int | None:
    """A field of /proc/self/status in kB (e.g. "VmRSS", "VmHWM"); None where unavailable."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def reset_rss_peak() -> bool:
    """Reset the process's peak resident set (VmHWM); False where the kernel does not allow it."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")
        return True
    return False


class PeakMemory:
    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:  # where the kernel does not allow it, the peak since the process started
            reset_rss_peak()

    def peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return rss_peak()


def rss_peak() -> int:
    if (kb := proc_status_kb("VmHWM")) is not None:
        return kb * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def logged_steps(path: Path) -> tuple[list[tuple[int, str]], list[int]]:
    """metrics.jsonl's records as (step, line), and the numbers of the lines that are not (cut short)."""
    records, damaged = [], []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append((int(json.loads(line)["step"]), line))
        except (ValueError, KeyError, TypeError):
            damaged.append(n)
    return records, damaged


class MetricsLog:
    """Appends one JSON object per optimizer step to `metrics.jsonl`, mirrors it to wandb."""

    def __init__(self, run_dir: Path, wandb_mode: Literal["offline", "online", "disabled"], project: str,
                 name: str, config: dict, resume_step: int = 0):
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists():  # keep only the history up to the checkpoint we resume from
            records, damaged = logged_steps(self.path)
            kept = [line for step, line in records if step <= resume_step]
            if damaged:
                log.warning("%s: dropped line(s) %s, which are not whole JSON records (a write cut short)",
                            self.path, ", ".join(map(str, damaged)))
            self.path.write_text("".join(line + "\n" for line in kept))
        self._f = open(self.path, "a")
        self.wandb = None
        if wandb_mode != "disabled":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self.wandb = wandb.init(project=project, name=name, dir=str(run_dir), mode=wandb_mode, config=config,
                                    resume="allow",
                                    id=f"{name}-{hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]}")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def close(self) -> None:
        self._f.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
