"""The per-token output of an eval, `tokens.parquet` (columns: docs/architecture.md, On-disk formats),
the readers of an eval's files, and the cache that lets an interrupted eval resume (`WindowCache`). One
row group per window row, so readers stream; every data page carries a CRC32 the readers verify, so a
changed byte is a "damaged" error naming the file."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from genome_lm.errors import GenomeLMError, first_line
from genome_lm.genome.tokenizer import unpack_mask
from genome_lm.outputs import atomic_file

log = logging.getLogger(__name__)
TOKENS_FILE = "tokens.parquet"
SUMMARY_FILE = "summary.json"
META_COLUMNS = ["window", "chrom", "start", "end", "strand"]
ANNOTATIONS_KEY = b"genome_lm.annotations"
SCHEMA = pa.schema([("window", pa.int64()), ("chrom", pa.string()), ("start", pa.int64()), ("end", pa.int64()),
                    ("strand", pa.string()), ("nll", pa.list_(pa.float32())), ("repeat_mask", pa.list_(pa.uint8()))])


class RowWriter(pq.ParquetWriter):
    """A Parquet file written a row (row group) at a time, each data page with its CRC32; a context manager."""

    def __init__(self, path: Path, schema: pa.Schema):
        super().__init__(str(path), schema, compression="zstd", write_page_checksum=True)

    def add_row(self, **row) -> None:
        self.write_batch(pa.RecordBatch.from_pydict({k: [row[k]] for k in self.schema.names}, schema=self.schema))


class TokensWriter(RowWriter):
    """Writes `tokens.parquet` one window (row group) at a time: SCHEMA plus the optional columns; the
    annotation NAMEs go in the schema metadata."""

    def __init__(self, path: Path, leakage: bool = False, annotations: Sequence[str] = (), strands: bool = False):
        optional = [("leakage_mask", leakage, pa.list_(pa.uint8())),
                    ("annotation_masks", annotations, pa.list_(pa.list_(pa.uint8()))),
                    ("reverse_complement", strands, pa.bool_())]
        fields = list(SCHEMA) + [pa.field(name, kind) for name, wanted, kind in optional if wanted]
        meta = {ANNOTATIONS_KEY: json.dumps(list(annotations)).encode()} if annotations else None
        super().__init__(path, pa.schema(fields, metadata=meta))

    def add(self, window: int, where: tuple[str, int, int, str], rec: dict, rc: bool) -> None:
        """One row: `where` (chrom, start, end, strand), a window record as `iter_windows` yields them (masks
        bool [L]) and `rc`, whether the row scored the reverse complement; the columns the file lacks are left out."""
        self.add_row(window=window, chrom=where[0], start=where[1], end=where[2], strand=where[3],
                     nll=np.asarray(rec["nll"], dtype=np.float32), repeat_mask=np.packbits(rec["repeat"]),
                     leakage_mask=None if rec["leakage"] is None else np.packbits(rec["leakage"]),
                     annotation_masks=[np.packbits(m) for m in rec["annotations"].values()], reverse_complement=rc)


def _file(directory: str | Path, name: str, command: str) -> Path:
    path = Path(directory) / name
    if not path.is_file():
        raise GenomeLMError(f"{directory} has no {name}; is it the --out of `genome-lm {command}`?")
    return path


@contextlib.contextmanager
def readable(path: Path, command: str) -> Iterator[None]:
    """A parse failure of `path` (not JSON, not Parquet, truncated) as one `GenomeLMError`."""
    try:
        yield
    except (ValueError, pa.ArrowException, OSError) as e:
        if isinstance(e, OSError) and not isinstance(e, pa.ArrowException) and e.errno is not None:
            raise  # a file-system error (permissions, a full disk), not a damaged file
        raise GenomeLMError(f"{path} is damaged ({first_line(e)}); rebuild it with `genome-lm {command}` and "
                            "--overwrite") from None


def read_meta(eval_dir: str | Path) -> dict[str, np.ndarray]:
    """META_COLUMNS of the forward rows (not --strands both's reverse complements) as arrays [W], plus `length`."""
    path = _file(eval_dir, TOKENS_FILE, "eval")
    with readable(path, "eval"):
        rc = "reverse_complement" in pq.read_schema(path).names
        table = pq.read_table(path, columns=META_COLUMNS, filters=[("reverse_complement", "=", False)] if rc else None,
                              page_checksum_verification=True)
    meta = {c: table.column(c).to_numpy(zero_copy_only=False) for c in META_COLUMNS}
    meta["length"] = meta["end"] - meta["start"]
    return meta


def _values(column, row: int) -> np.ndarray:
    return column[row].values.to_numpy(zero_copy_only=False)


def table_rows(path: Path) -> Iterator[tuple[pa.Table, int]]:
    """(row group, row) of each row of an eval's Parquet file `path`, a row group read at a time."""
    with readable(path, "eval"):
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    for g in range(pf.num_row_groups):
        with readable(path, "eval"):
            table = pf.read_row_group(g)
        yield from ((table, row) for row in range(table.num_rows))


def iter_windows(eval_dir: str | Path, orientation: str | None = None) -> Iterator[dict]:
    """Rows in file order: META_COLUMNS, nll float32 [L], repeat bool [L], leakage bool [L] or None (no
    leakage_mask column), annotations {NAME: bool [L]} ({} without any), rc (True: the row scored the reverse
    complement of its shard row). `orientation` "forward" / "reverse": only the rows with rc False / True."""
    path = _file(eval_dir, TOKENS_FILE, "eval")
    with readable(path, "eval"):
        meta = pq.read_schema(path).metadata or {}
    names = json.loads(meta[ANNOTATIONS_KEY]) if ANNOTATIONS_KEY in meta else []  # the --annotate NAMEs, in order
    for table, row in table_rows(path):
        cols = set(table.column_names)
        rc = bool(table.column("reverse_complement")[row].as_py()) if "reverse_complement" in cols else False
        if orientation is not None and rc != (orientation == "reverse"):
            continue
        rec = {c: table.column(c)[row].as_py() for c in META_COLUMNS}
        rec["nll"] = _values(table.column("nll"), row)  # float32
        L = len(rec["nll"])
        rec["repeat"] = unpack_mask(_values(table.column("repeat_mask"), row), L)
        rec["leakage"] = unpack_mask(_values(table.column("leakage_mask"), row), L) if "leakage_mask" in cols \
            else None
        per_name = table.column("annotation_masks")[row].values if names else []  # list<list<uint8>> [A]
        rec["annotations"] = {n: unpack_mask(_values(per_name, k), L) for k, n in enumerate(names)}
        rec["rc"] = rc
        yield rec


def read_json(directory: str | Path, name: str, command: str) -> dict:
    """DIR/name as JSON; one `GenomeLMError` when it is missing or damaged."""
    path = _file(directory, name, command)
    with readable(path, command):
        return json.loads(path.read_text())


def load_summary(eval_dir: str | Path) -> dict:
    """OUT/summary.json of an eval directory, checked for what every eval writes."""
    summary = read_json(eval_dir, SUMMARY_FILE, "eval")
    config = summary.get("config") if isinstance(summary, dict) else None
    missing = [k for k in ("overall", "buckets", "config") if not isinstance(summary, dict) or k not in summary
               or (k == "config" and not isinstance(config, dict))]
    missing += [f"config.{k}" for k in ("seq_len", "buckets") if isinstance(config, dict) and k not in config]
    if missing:
        raise GenomeLMError(f"{Path(eval_dir) / SUMMARY_FILE} is not an eval's summary (it has no "
                            f"{', '.join(missing)}); rebuild it with `genome-lm eval` and --overwrite")
    return summary


def cache_dir_for(out: Path) -> Path:
    return out.parent / f".{out.name}.eval-cache"


class WindowCache:
    """Resumable per-window cache beside the output, `PARENT/.NAME.eval-cache/`: key.json (what the scores
    depend on; a cache of another key is discarded) and wNNNNNNN.npz per window (`nll` float32 [L], NaN =
    not scored, and the other passes' arrays), each written under a temporary name and renamed. The folder
    is made with the first scored window and removed once the outputs are complete."""

    def __init__(self, out: Path, key: dict):
        self.dir, self.key = cache_dir_for(Path(out)), key
        if self.dir.exists():
            try:
                old = json.loads((self.dir / "key.json").read_text())
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
