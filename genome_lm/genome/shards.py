"""Dataset shards: one Hugging Face dataset per split, written straight to Arrow.

A split directory is exactly what `datasets.Dataset.save_to_disk` writes, so `datasets.load_from_disk`
opens it memory-mapped; genome_lm writes it itself so that rows stream to disk one window at a time and the
same input gives the same bytes. Row schema: docs/architecture.md, On-disk formats."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from genome_lm.errors import GenomeLMError, first_line

SPLITS = ("train", "eval")
BATCH_TOKENS = 1 << 20  # rows are grouped into Arrow record batches of about this many tokens
LEAKAGE_COLUMN = "leakage_mask"


def features(leakage: bool = False) -> dict:
    """The `datasets.Features` of a split as `Features.to_dict()` gives them (written by hand so `prepare` does
    not import `datasets`); with `leakage`, the leakage_mask column after repeat_mask."""
    value = {dtype: {"dtype": dtype, "_type": "Value"} for dtype in ("string", "int64", "uint8", "float32")}
    uint8s = {"feature": value["uint8"], "_type": "List"}
    return {"chrom": value["string"], "start": value["int64"], "end": value["int64"], "strand": value["string"],
            "tokens": uint8s, "repeat_mask": uint8s, **({LEAKAGE_COLUMN: uint8s} if leakage else {}),
            "n_frac": value["float32"]}


# Arrow arrays straight from numpy buffers: zero-copy, and `pa.array` would import pandas.
def _primitive(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(np.ascontiguousarray(values))])


def _offsets(lengths) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return _primitive(offsets, pa.int32())


def _strings(values) -> pa.Array:
    encoded = [v.encode() for v in values]
    offsets = _offsets([len(b) for b in encoded])
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [None, offsets.buffers()[1], pa.py_buffer(b"".join(encoded))])


def _lists(arrays) -> pa.Array:
    """list<uint8> from uint8 arrays; a single array (a 1M-token window) is not copied."""
    values = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    return pa.ListArray.from_arrays(_offsets([len(a) for a in arrays]), _primitive(values, pa.uint8()))


class SplitWriter:
    """Streams windows of one split into Arrow shard files, one per `open_shard()`; `leakage`: rows have one;
    `megatron`: each window is also a document of `megatron/{split}.bin` beside the split's folder."""

    def __init__(self, directory: Path, leakage: bool = False, megatron: bool = False):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.megatron = megatron_builder(directory.parent / "megatron" / directory.name) if megatron else None
        self.features = feats = features(leakage)  # as Arrow types, with the metadata `datasets` reads back
        self.schema = pa.schema([(name, pa.list_(pa.type_for_alias(f["feature"]["dtype"])) if f["_type"] == "List"
                                  else pa.type_for_alias(f["dtype"])) for name, f in feats.items()],
                                metadata={"huggingface": json.dumps({"info": {"features": feats}})})
        self.shards: list[Path] = []
        self._sink: Any = None  # pyarrow's file and stream writer (pyarrow ships no types)
        self._writer: Any = None
        self._batch: list[tuple] = []
        self._batch_tokens = 0
        # Arrow writes release the GIL: a batch is written on a helper thread while the next window is cut
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arrow-writer")
        self._pending = self._pool.submit(lambda: None)  # the batch being written (at most one)

    def open_shard(self) -> None:
        self.close_shard()
        path = self.dir / f".shard-{len(self.shards):05d}.arrow"
        self.shards.append(path)
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)

    def add(self, chrom: str, start: int, end: int, strand: str, tokens: np.ndarray, mask_packed: np.ndarray,
            n_frac: float, leak_packed: np.ndarray | None = None) -> None:
        self._batch.append((chrom, start, end, strand, tokens, mask_packed,
                            *([] if leak_packed is None else [leak_packed]), n_frac))  # in schema order
        self._batch_tokens += len(tokens)
        if self.megatron is not None:
            self.megatron.add_document(tokens, [len(tokens)])
        if self._batch_tokens >= BATCH_TOKENS:
            self._flush()

    def _flush(self) -> None:
        if not self._batch:
            return
        columns = [_lists(values) if pa.types.is_list(f.type) else _strings(values) if pa.types.is_string(f.type)
                   else _primitive(np.array(values, dtype=f.type.to_pandas_dtype()), f.type)
                   for values, f in zip(zip(*self._batch), self.schema)]
        batch = pa.record_batch(columns, schema=self.schema)
        self._pending.result()
        self._pending = self._pool.submit(self._writer.write_batch, batch)
        self._batch, self._batch_tokens = [], 0

    def close_shard(self) -> None:
        if self._writer is not None:
            self._flush()
            self._pending.result()
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None

    def finalize(self, fingerprint: str, split: str) -> list[str]:
        """Close the last shard, give shards their final names, write dataset_info/state JSON."""
        self.close_shard()
        self._pool.shutdown(wait=True)
        names = [f"data-{i:05d}-of-{len(self.shards):05d}.arrow" for i in range(len(self.shards))]
        for path, name in zip(self.shards, names):
            os.replace(path, self.dir / name)
        state: dict[str, Any] = {
            "_data_files": [{"filename": name} for name in names],
            "_fingerprint": fingerprint,
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": split,
        }
        info = {"citation": "", "description": "genome_lm shards: one row per genome window",
                "features": self.features}
        (self.dir / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        (self.dir / "dataset_info.json").write_text(json.dumps(info, indent=2))
        if self.megatron is not None:
            self.megatron.finalize(f"{self.dir.parent / 'megatron' / split}.idx")
        return names


def megatron_builder(prefix: Path):
    """A megatron-core IndexedDatasetBuilder writing `{prefix}.bin` (Megatron IndexedDataset, uint8 tokens, one
    document per window, for Megatron-LM / BioNeMo users); its `finalize` takes `{prefix}.idx`."""
    try:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    except ImportError:
        raise GenomeLMError(
            "--format megatron needs megatron-core; install it with `pip install 'genome_lm[megatron]'`"
        ) from None
    prefix.parent.mkdir(exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint8)


def fingerprint_of(obj) -> str:
    """sha256 of `obj`'s canonical JSON (hex)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


REBUILD = "rebuild them with the same `genome-lm prepare` command and --overwrite"


def manifest_checksum(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON without its own `checksum` field."""
    return fingerprint_of({k: v for k, v in manifest.items() if k != "checksum"})


def load_manifest(directory: str | os.PathLike) -> dict:
    """manifest.json of a prepared shard directory, checked against its own checksum."""
    path = Path(directory) / "manifest.json"
    if not path.exists():
        where = "" if Path(directory).is_absolute() else \
            f" (a relative path: read from the working directory {Path.cwd()})"
        raise GenomeLMError(f"{directory} has no manifest.json{where}; is it the --out of `genome-lm prepare`?")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise GenomeLMError(f"{path} is damaged (not JSON: {e}); {REBUILD}") from None
    if not isinstance(manifest, dict) or "splits" not in manifest:
        raise GenomeLMError(f"{path} is not a genome_lm manifest (no splits); {REBUILD}")
    if "checksum" in manifest and manifest["checksum"] != manifest_checksum(manifest):
        raise GenomeLMError(f"{path} was changed after prepare wrote it (its checksum does not match); {REBUILD}")
    return manifest


def check_shards(directory: str | os.PathLike, manifest: dict, splits: Iterable[str] | None = None) -> None:
    """`GenomeLMError` naming the first split file missing or of another size than `manifest` records."""
    problems = []
    for split in manifest["splits"] if splits is None else splits:
        entry = manifest["splits"].get(split, {})
        sizes = entry.get("file_bytes") or dict.fromkeys(entry.get("files", []))
        for name, size in sizes.items():
            path = Path(directory) / split / name
            if not path.is_file():
                problems.append(f"{split}/{name} is missing")
            elif size is not None and path.stat().st_size != size:
                problems.append(f"{split}/{name} has {path.stat().st_size:,} bytes, the manifest records {size:,}")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise GenomeLMError(f"the shards in {directory} are damaged: {problems[0]}{more}; {REBUILD}")


def load_shards(directory: str | os.PathLike, split: str = "train"):
    """The `split` of a prepared shard directory: a memory-mapped `datasets.Dataset`, numpy format (uint8 tokens)."""
    import datasets

    if split not in SPLITS:
        raise GenomeLMError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    manifest = load_manifest(directory)
    if split not in manifest["splits"]:
        raise GenomeLMError(f"{directory} has no {split!r} split (it has: {', '.join(manifest['splits'])})")
    check_shards(directory, manifest, [split])
    try:
        ds = datasets.load_from_disk(str(Path(directory) / split))
    except (OSError, ValueError) as e:  # arrow files of the recorded sizes that do not parse
        if isinstance(e, OSError) and e.errno is not None:
            raise  # a file-system error (permissions), not a damaged file
        raise GenomeLMError(f"the shards in {directory} are damaged: {split}/ does not load ({first_line(e)}); "
                            f"{REBUILD}") from None
    return ds.with_format("numpy", dtype=None)  # dtype=None keeps uint8 tokens (the default casts to int64)
