"""What `genome-lm score` writes, incrementally, and how a killed score resumes (the files: docs/score.md).

Everything is written into the work folder `PARENT/.NAME.score-work/` (its `key.json` records the inputs)
and moved into a new OUT (`files.atomic_directory`) when the last region is done. A region is complete when
its Parquet file is renamed into place and `done/NNNNNN` exists, after its embedding rows are flushed; a
rerun with the same inputs scores only the others; other inputs are refused while the work folder exists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from genome_lm.errors import GenomeLMError
from genome_lm.outputs import atomic_file

SCHEMA = pa.schema([("region", pa.string()), ("chrom", pa.string()), ("pos", pa.int64()), ("strand", pa.string()),
                    ("logp", pa.float32())] + [(f"logp_{b}", pa.float32()) for b in "acgt"])
STRAND_NAMES = {"+": "forward", "-": "reverse"}


def work_dir_for(out: Path) -> Path:
    return out.parent / f".{out.name}.score-work"


def open_work(out: Path, key: dict) -> tuple[Path, set[int]]:
    """The work folder of `out` for inputs `key`, and the regions it has completed; a folder left by a score
    of other inputs is refused in one line."""
    work = work_dir_for(out)
    key = json.loads(json.dumps(key))  # as key.json reads back
    if (work / "key.json").is_file():
        old = json.loads((work / "key.json").read_text())
        if old != key:
            changed = ", ".join(k for k in sorted(set(old) | set(key)) if old.get(k) != key.get(k))
            raise GenomeLMError(f"--out {out}: {work} holds an interrupted score of other inputs (they differ in "
                                f"{changed}); rerun that command to finish it, or delete {work} to start over")
    else:
        shutil.rmtree(work, ignore_errors=True)
        (work / "done").mkdir(parents=True)
        with atomic_file(work / "key.json", "w") as f:
            f.write(json.dumps(key, indent=1))
    (work / "logp").mkdir(exist_ok=True)
    (work / "embeddings").mkdir(exist_ok=True)
    return work, {int(p.name) for p in (work / "done").iterdir()}


def embedding_files(work: Path, layers: list[int], strands: list[str], rows: int, width: int) -> dict:
    """(layer, strand) -> float16 memmap [rows, width] in `work` (made, or opened again on resume)."""
    out = {}
    for layer in layers:
        for s in strands:
            path = work / "embeddings" / f"layer{layer}.{STRAND_NAMES[s]}.npy"
            mode = "r+" if path.exists() else "w+"
            out[layer, s] = np.lib.format.open_memmap(path, mode=mode, dtype=np.float16, shape=(rows, width))
    return out


class RegionWriter:
    """One region's rows, chunk by chunk: per-base rows to its Parquet file, embeddings into the memmaps
    (`stride` 1), or summed per bin of `stride` bases (None: one bin) and written as means at `close`."""

    def __init__(self, work: Path, index: int, region, files: dict, row: int, stride: int | None):
        self.work, self.index, self.region, self.files, self.row, self.stride = work, index, region, files, row, stride
        self.path = work / "logp" / f"r{index:06d}.parquet"
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.writer = pq.ParquetWriter(self.tmp, SCHEMA)
        length = region.end - region.start
        bins = 1 if stride is None else -(-length // stride)
        self.sums = {k: torch.zeros(bins, m.shape[1], dtype=torch.float64) for k, m in files.items()} \
            if stride != 1 else {}
        self.counts = torch.from_numpy(np.minimum(stride or length, length - np.arange(bins) * (stride or 0)))  # [bins]

    def add(self, strand: str, chunk) -> None:
        """The rows of one engine `Chunk` of this region on `strand` (positions along the scored sequence)."""
        r = self.region
        n, length = len(chunk.logp), r.end - r.start
        rel = np.arange(chunk.start, chunk.start + n) if strand == "+" else length - 1 - np.arange(chunk.start,
                                                                                                  chunk.start + n)
        acgt = chunk.logp_acgt.cpu().numpy()
        cols = [pa.repeat(r.name, n), pa.repeat(r.chrom, n), pa.array(r.start + rel), pa.repeat(strand, n),
                pa.array(chunk.logp.cpu().numpy())] + [pa.array(acgt[:, j]) for j in range(4)]
        self.writer.write_table(pa.Table.from_arrays(cols, schema=SCHEMA))  # one row group per chunk
        for layer, emb in chunk.embeddings.items():
            if (layer, strand) not in self.files:
                continue
            if self.stride == 1:
                lo = int(rel.min())
                self.files[layer, strand][self.row + lo : self.row + lo + n] = \
                    (emb if strand == "+" else emb.flip(0)).cpu().numpy().astype(np.float16)
            else:
                bins = torch.from_numpy(rel // self.stride if self.stride else np.zeros_like(rel))
                self.sums[layer, strand].index_add_(0, bins, emb.cpu().double())

    def close(self) -> None:
        """Flush the embeddings, rename the Parquet file into place, mark the region done."""
        self.writer.close()
        for key, sums in self.sums.items():
            self.files[key][self.row : self.row + len(sums)] = (sums / self.counts[:, None]).numpy().astype(np.float16)
        for m in self.files.values():
            m.flush()
        self.tmp.replace(self.path)
        (self.work / "done" / f"{self.index:06d}").touch()
