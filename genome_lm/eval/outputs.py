"""The per-token output of an eval: `tokens.parquet`, one row per window.

Columns: window (int64, row of the shard split), chrom, start, end (int64, 0-based half-open on
the forward strand), strand ('+'/'-'), nll (list<float32> [L], nats; NaN = not scored),
repeat_mask (list<uint8>, numpy.packbits of the per-token soft-mask flag, as in the shards).

Token j of a window maps to genome position `start + j` on '+' rows and `end - 1 - j` on '-'
rows (which hold the reverse complement). Its preceding context is `j % seq_len` (seq_len from
summary.json's config). One row group per window, so readers stream window by window.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from genome_lm.errors import GenomeLMError
from genome_lm.genome.tokenizer import unpack_mask

TOKENS_FILE = "tokens.parquet"
SUMMARY_FILE = "summary.json"
META_COLUMNS = ["window", "chrom", "start", "end", "strand"]
SCHEMA = pa.schema([
    ("window", pa.int64()),
    ("chrom", pa.string()),
    ("start", pa.int64()),
    ("end", pa.int64()),
    ("strand", pa.string()),
    ("nll", pa.list_(pa.float32())),
    ("repeat_mask", pa.list_(pa.uint8())),
])


class TokensWriter(pq.ParquetWriter):
    """Writes `tokens.parquet` one window (row group) at a time; use as a context manager."""

    def __init__(self, path: Path):
        super().__init__(str(path), SCHEMA, compression="zstd")

    def add(self, window: int, chrom: str, start: int, end: int, strand: str, nll: np.ndarray,
            repeat_packed: np.ndarray) -> None:
        row = {"window": window, "chrom": chrom, "start": start, "end": end, "strand": strand,
               "nll": np.asarray(nll, dtype=np.float32), "repeat_mask": np.asarray(repeat_packed, dtype=np.uint8)}
        self.write_batch(pa.RecordBatch.from_pydict({k: [v] for k, v in row.items()}, schema=SCHEMA))


def _file(directory: str | Path, name: str, command: str) -> Path:
    """DIR/name, written by `genome-lm command`; a GenomeLMError if it is not there."""
    path = Path(directory) / name
    if not path.is_file():
        raise GenomeLMError(f"{directory} has no {name}; is it the --out of `genome-lm {command}`?")
    return path


def read_meta(eval_dir: str | Path) -> dict[str, np.ndarray]:
    """The window columns (window, chrom, start, end, strand) as numpy arrays [W], plus `length`."""
    table = pq.read_table(_file(eval_dir, TOKENS_FILE, "eval"), columns=META_COLUMNS)
    meta = {c: table.column(c).to_numpy(zero_copy_only=False) for c in META_COLUMNS}
    meta["length"] = meta["end"] - meta["start"]
    return meta


def iter_windows(eval_dir: str | Path) -> Iterator[dict]:
    """Windows in file order: window/chrom/start/end/strand, nll float32 [L], repeat bool [L]."""
    pf = pq.ParquetFile(_file(eval_dir, TOKENS_FILE, "eval"))
    for g in range(pf.num_row_groups):
        table = pf.read_row_group(g)
        for row in range(table.num_rows):
            rec = {c: table.column(c)[row].as_py() for c in META_COLUMNS}
            rec["nll"] = table.column("nll")[row].values.to_numpy(zero_copy_only=False)  # float32
            packed = table.column("repeat_mask")[row].values.to_numpy(zero_copy_only=False)
            rec["repeat"] = unpack_mask(packed, len(rec["nll"]))
            yield rec


def read_json(directory: str | Path, name: str, command: str) -> dict:
    return json.loads(_file(directory, name, command).read_text())


def load_summary(eval_dir: str | Path) -> dict:
    """OUT/summary.json of an eval directory."""
    return read_json(eval_dir, SUMMARY_FILE, "eval")
