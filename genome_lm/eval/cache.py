"""Resumable per-window cache beside the output, `PARENT/.NAME.eval-cache/`: key.json (what the scores
depend on; a cache of another key is discarded) and wNNNNNNN.npz per window (`nll` float32 [L], NaN =
not scored, and the other passes' arrays), each written under a temporary name and renamed. The folder
is made with the first scored window and removed once the outputs are complete."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np

from genome_lm.outputs import atomic_file

log = logging.getLogger(__name__)


def cache_dir_for(out: Path) -> Path:
    return out.parent / f".{out.name}.eval-cache"


class WindowCache:
    def __init__(self, out: Path, key: dict):
        self.dir = cache_dir_for(Path(out))
        self.key = key
        key_file = self.dir / "key.json"
        if self.dir.exists():
            try:
                old = json.loads(key_file.read_text())
            except (OSError, json.JSONDecodeError):
                old = None
            if old != key:
                log.warning("discarding the eval cache %s: it was made with other settings", self.dir)
                shutil.rmtree(self.dir)
        for tmp in self.dir.glob(".w*.tmp"):  # half-written by a killed run
            tmp.unlink(missing_ok=True)

    def _path(self, index: int) -> Path:
        return self.dir / f"w{index:07d}.npz"

    def has(self, index: int) -> bool:
        return self._path(index).exists()

    def put(self, index: int, **arrays: np.ndarray) -> None:
        if not self.dir.exists():  # the first window: the folder and its key
            self.dir.mkdir(parents=True)
            with atomic_file(self.dir / "key.json", "w") as f:
                f.write(json.dumps(self.key, indent=2, sort_keys=True))
        with atomic_file(self._path(index), "wb") as f:  # .wNNNNNNN.npz.*.tmp until complete
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub: **arrays could fill allow_pickle

    def get(self, index: int) -> dict[str, np.ndarray]:
        with np.load(self._path(index)) as z:
            return {k: z[k] for k in z.files}

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
