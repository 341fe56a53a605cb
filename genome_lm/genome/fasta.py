"""FASTA reading: plain, gzip and bgzip files, any line width, CRLF, several records per file.

A file is read once in large blocks: headers found with `bytes.find`, sequence bytes mapped to codes and
stripped of line ends in one `bytes.translate`, only wanted records kept. With a `.fai` index (and bgzip's
`.gzi`) wanted records are read by random access. Every file is hashed (sha256) as it is read."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import numpy as np
from tqdm import tqdm

from genome_lm.errors import GenomeLMError
from genome_lm.genome.params import chrom_match_key
from genome_lm.genome.tokenizer import CODE_LUT, INVALID, TOKEN_MASK

log = logging.getLogger(__name__)

BLOCK_BYTES = 8 << 20
_CODE_TABLE = CODE_LUT.tobytes()
_STRIP = b"\r\n\t "  # line ends (and stray blanks) are not bases


@dataclass
class Record:
    """One FASTA record read into codes [T] uint8 (see `tokenizer` for the bit layout)."""

    name: str
    codes: np.ndarray
    source: str


@dataclass
class FileInfo:
    """What the manifest records about an input file; complete once the file was read."""

    path: str
    size: int
    sha256: str = ""
    compression: str = "none"  # none | gzip | bgzip
    records: list[str] = field(default_factory=list)


class _HashingReader:
    """A raw binary file that hashes every byte read (sha256, on a helper thread: hashlib releases the GIL)."""

    def __init__(self, raw: BinaryIO, progress: Callable[[int], None]):
        self.raw = raw
        self._sha = hashlib.sha256()
        self._progress = progress
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        self._pending = self._pool.submit(lambda: None)  # the block being hashed

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self._pending.result()  # at most one block in flight
        self._pending = self._pool.submit(self._sha.update, data)
        self._progress(len(data))
        return data

    def hexdigest(self) -> str:
        while self.read(BLOCK_BYTES):
            pass
        self._pending.result()
        return self._sha.hexdigest()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def check_writable(directory: Path, option: str = "--out") -> None:
    """Create `directory` if needed; GenomeLMError (naming the flag `option`) if it is not writable."""
    if directory.exists() and not directory.is_dir():
        raise GenomeLMError(f"{option} {directory} is a file; give a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".genome-lm-write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise GenomeLMError(f"cannot write to {directory} ({e.strerror}); "
                            f"choose a writable directory with {option}") from None


class FastaReader:
    """One FASTA file: `records(wanted)` yields a `Record` per wanted name, in file order, and fills `info`
    (sha256; all record names, unless an index gave them) once the whole file has been read."""

    def __init__(self, path: str | os.PathLike, show_progress: bool | None = None):
        self.path = p = Path(path)
        if not p.exists():
            raise GenomeLMError(f"FASTA file {p} does not exist; check the --fasta path")
        if p.is_dir():
            raise GenomeLMError(f"--fasta {p} is a directory; pass the FASTA file itself")
        if (size := p.stat().st_size) == 0:
            raise GenomeLMError(f"FASTA file {p} is empty; re-download or regenerate it")
        with open(p, "rb") as f:
            head = f.read(18)
        # bgzip: a gzip member with FEXTRA holding the 'BC' subfield
        bgzip = len(head) >= 14 and head[3] & 4 and head[12:14] == b"BC"
        self.info = FileInfo(path=str(p.resolve()), size=size,
                             compression="none" if head[:2] != b"\x1f\x8b" else "bgzip" if bgzip else "gzip")
        self.show_progress = show_progress
        self._index: Any = None  # a pyfaidx.Faidx when the file has a usable index
        fai = Path(f"{p}.fai")
        if (not fai.exists() or fai.stat().st_mtime < p.stat().st_mtime or self.info.compression == "gzip"
                or (self.info.compression == "bgzip" and not Path(f"{p}.gzi").exists())):
            return  # no index, a stale one, or no random access (plain gzip, bgzip without .gzi)
        try:
            import pyfaidx

            self._index = pyfaidx.Faidx(str(p), build_index=False, rebuild=False, as_raw=True)
            self.info.records = list(self._index.index)
            log.debug("using index %s", fai)
        except Exception as e:  # a stale or foreign index: fall back to streaming
            log.warning("ignoring index %s (%s); reading %s sequentially", fai, e, p)

    def records(self, wanted: Callable[[str], bool]) -> Iterator[Record]:
        disable = None if self.show_progress is None else not self.show_progress  # None: only on a TTY
        bar = tqdm(total=self.info.size, unit="B", unit_scale=True, desc=self.path.name, disable=disable, leave=False)
        with bar, open(self.path, "rb") as raw, contextlib.closing(_HashingReader(raw, bar.update)) as reader:
            if self._index is not None:
                yield from self._indexed_records(wanted)
            else:
                yield from self._stream_records(reader, wanted)
            self.info.sha256 = reader.hexdigest()

    def _read_block(self, stream) -> bytes:
        try:
            return stream.read(BLOCK_BYTES)
        except EOFError:
            raise GenomeLMError(
                f"{self.path}: the gzip stream is truncated (file ends early); re-download the file"
            ) from None
        except (gzip.BadGzipFile, zlib.error, OSError) as e:
            raise GenomeLMError(f"{self.path}: corrupt gzip data ({e}); re-download the file") from None

    def _stream_records(self, reader: _HashingReader, wanted: Callable[[str], bool]) -> Iterator[Record]:
        # typeshed asks GzipFile's file object for seek(), which reading forward never calls
        plain = self.info.compression == "none"
        stream = reader if plain else gzip.GzipFile(fileobj=reader, mode="rb")  # type: ignore[call-overload]
        if not (block := self._read_block(stream)):
            raise GenomeLMError(f"FASTA file {self.path} holds no data (empty after decompression)")
        if (head := block.lstrip()) and head[:1] != b">":
            printable = all(32 <= b < 127 or b in b"\t\r\n" for b in head[:20])
            what = f"with {head[:20].decode('ascii')!r}" if printable else "with binary data"
            raise GenomeLMError(f"{self.path} is not a FASTA file: it starts {what} instead of a '>' header line")
        names: dict[str, None] = {}  # record names in file order (an ordered set)
        name, buf = "", None  # the current record; its codes if it is wanted
        header: bytearray | None = None  # a header line being read
        at_line_start = True
        while block:
            pos, n = 0, len(block)
            while pos < n:
                if header is not None:  # inside a header line
                    nl = block.find(b"\n", pos)
                    header += block[pos:] if nl < 0 else block[pos:nl]
                    if nl < 0:
                        break
                    name, buf = self._start(bytes(header), names, wanted)
                    header, pos, at_line_start = None, nl + 1, True
                elif block[pos] == 0x3E and at_line_start:  # '>' opens a header line
                    if buf is not None:
                        yield Record(name, np.frombuffer(buf, np.uint8), str(self.path))
                    buf, header, pos = None, bytearray(), pos + 1
                else:  # sequence up to the next '>' (a '>' inside a line: an invalid character)
                    idx = block.find(b">", pos + 1)  # headers are rare: one memchr per block
                    end = n if idx < 0 else idx
                    if buf is not None:  # (a slice of the whole block is the block itself: no copy)
                        buf += _codes(self.path, name, block[pos:end], len(buf))
                    elif not names and block[pos:end].strip():
                        raise GenomeLMError(f"{self.path} is not a FASTA file: sequence data before the first '>' "
                                            "header")
                    at_line_start, pos = block[end - 1] == 0x0A, end
            block = self._read_block(stream)
        if header is not None:
            name, buf = self._start(bytes(header), names, wanted)
        if buf is not None:
            yield Record(name, np.frombuffer(buf, np.uint8), str(self.path))
        self.info.records = list(names)

    def _start(self, header: bytes, names: dict[str, None],
               wanted: Callable[[str], bool]) -> tuple[str, bytearray | None]:
        """The record a header line (without its '>') opens, added to `names`; an empty buffer if it is wanted."""
        if not (fields := header.split()):
            raise GenomeLMError(f"{self.path}: a '>' header line without a record name; give every record a name")
        name = fields[0].decode("ascii", errors="replace")
        if name in names:
            raise GenomeLMError(f"{self.path}: duplicate record name {name!r}; each chromosome may appear once")
        names[name] = None
        return name, bytearray() if wanted(name) else None

    def _indexed_records(self, wanted: Callable[[str], bool]) -> Iterator[Record]:
        for name, rec in self._index.index.items():
            if not wanted(name):
                continue
            buf = bytearray()
            if self.info.compression == "none":
                with open(self.path, "rb") as f:
                    f.seek(max(0, rec.offset - 4096))
                    before = f.read(rec.offset - f.tell())  # ends with the record's header line (a right index)
                    header = before[before.rfind(b"\n>", 0, len(before) - 1) + 1:]
                    stale = not (before.endswith(b"\n") and header[:1] == b">"
                                 and header[1:].split()[:1] == [name.encode()])
                    for s in range(rec.offset, rec.bend, BLOCK_BYTES):  # a short file reads b"": caught below
                        if stale or b">" in (piece := f.read(min(BLOCK_BYTES, rec.bend - s))):  # another header
                            raise GenomeLMError(f"{self.path}.fai does not match {self.path} (record {name} is not "
                                                "where the index says); delete the .fai so it is rebuilt")
                        buf += _codes(self.path, name, piece, len(buf))
            else:  # bgzip: random access through pyfaidx, in pieces
                for s in range(0, rec.rlen, BLOCK_BYTES):
                    piece = self._index.fetch(name, s + 1, min(s + BLOCK_BYTES, rec.rlen))
                    buf += _codes(self.path, name, str(piece).encode("ascii"), len(buf))
            if len(buf) != rec.rlen:
                raise GenomeLMError(
                    f"{self.path}.fai does not match {self.path} (record {name}: index says {rec.rlen} bases, "
                    f"read {len(buf)}); delete the .fai so it is rebuilt"
                )
            yield Record(name, np.frombuffer(buf, np.uint8), str(self.path))


def _codes(path: Path, name: str, seg: bytes, offset: int) -> bytes:
    """The codes of `seg`, line ends dropped; `offset`: the record's bases before `seg`."""
    codes = seg.translate(_CODE_TABLE, _STRIP)
    if (bad := codes.find(INVALID)) >= 0:
        ch = seg.translate(None, _STRIP)[bad : bad + 1].decode("ascii", errors="replace")
        raise GenomeLMError(
            f"{path}: record {name}: invalid character {ch!r} at base offset {offset + bad} "
            "(0-based); only A, C, G, T, N and IUPAC codes (any case) are allowed — fix or remove it"
        )
    return codes


def contig_key(name: str) -> str:
    """The key a contig name matches by: 'chr1', 'Chr1', '1' -> '1'; 'chrM', 'MT' -> 'mt'."""
    key = chrom_match_key(name)
    return "mt" if key == "m" else key  # chrM (UCSC) is MT (Ensembl, NCBI)


@dataclass
class Reference:
    """Contigs of one FASTA: `records` maps each match key to (the file's record name, tokens [T] uint8)."""

    path: str
    sha256: str
    records: dict[str, tuple[str, np.ndarray]]
    all_names: list[str]

    @classmethod
    def load(cls, path: str | os.PathLike, chroms: Iterable[str] | None, show_progress: bool | None = None,
             missing_ok: bool = False) -> Reference:
        """Read `path` once, keeping the contigs named in `chroms` (any alias; None: every contig). A name the
        file lacks is a one-line error listing the file's names, unless `missing_ok` (then it is not in `records`)."""
        wanted = {contig_key(c): c for c in chroms or ()}
        reader = FastaReader(path, show_progress=show_progress)
        records = {contig_key(rec.name): (rec.name, rec.codes & TOKEN_MASK)
                   for rec in reader.records(lambda name: chroms is None or contig_key(name) in wanted)}
        missing = [c for k, c in wanted.items() if k not in records]
        if missing and not missing_ok:
            have = reader.info.records
            shown = ", ".join(have[:12]) + (f" and {len(have) - 12} more" if len(have) > 12 else "")
            raise GenomeLMError(f"{path} has no contig {', '.join(missing)} (it has {shown}); check the assembly "
                                "and the chromosome names")
        return cls(str(path), reader.info.sha256, records, list(reader.info.records))

    def record(self, chrom: str) -> str:
        """The FASTA's name for `chrom` (any alias)."""
        return self._get(chrom)[0]

    def tokens(self, chrom: str) -> np.ndarray:
        """Token ids [T] uint8 of the whole contig `chrom` (any alias)."""
        return self._get(chrom)[1]

    def _get(self, chrom: str) -> tuple[str, np.ndarray]:
        if (found := self.records.get(contig_key(chrom))) is None:
            raise GenomeLMError(f"{self.path}: contig {chrom} was not loaded; name it when the reference is loaded")
        return found
