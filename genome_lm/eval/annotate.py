"""BED annotations as eval strata (`eval --annotate FILE.bed[:NAME]`, docs/eval.md): a token is "in" when
its coordinate lies in one of the file's intervals (strand column ignored). Intervals are merged per
chromosome, so a mask is one `np.searchsorted` pair and a cumulative sum."""

from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.genome.prepare import chrom_match_key

log = logging.getLogger(__name__)
FLAG = "--annotate"
_SKIP = ("#", "track", "browser")


@dataclass
class Annotation:
    """One BED file: merged intervals per chromosome key, `starts`/`ends` int64 [M] sorted and disjoint."""

    name: str
    path: str
    intervals: dict[str, tuple[np.ndarray, np.ndarray]]
    n_lines: int  # intervals read from the file (before merging)
    names: dict[str, str] = field(default_factory=dict)  # chromosome key -> its name as the file first wrote it

    def mask(self, chrom: str, start: int, end: int, strand: str = "+") -> np.ndarray:
        """bool [end - start]: token j in an interval, in token order (`strand` '-': reversed)."""
        L = end - start
        starts, ends = self.intervals.get(chrom_match_key(chrom), (np.empty(0, np.int64), np.empty(0, np.int64)))
        i0, i1 = np.searchsorted(ends, start, side="right"), np.searchsorted(starts, end, side="left")
        edge = np.zeros(L + 1, dtype=np.int64)  # +1 where an interval opens, -1 where it closes (window frame)
        np.add.at(edge, np.clip(starts[i0:i1] - start, 0, L), 1)
        np.add.at(edge, np.clip(ends[i0:i1] - start, 0, L), -1)
        inside = np.cumsum(edge[:L]) > 0
        return inside[::-1].copy() if strand == "-" else inside

    def record(self) -> dict:
        """summary.json's `strata["annotations:NAME"]`."""
        return {"file": self.path, "intervals": self.n_lines,
                "merged_intervals": int(sum(len(s) for s, _ in self.intervals.values())),
                "bases": int(sum(int((e - s).sum()) for s, e in self.intervals.values())),
                "chroms": sorted(self.intervals)}


def parse_spec(spec: str) -> tuple[Path, str]:
    """'FILE.bed[:NAME]' -> (path, NAME); a path that exists as given is taken whole."""
    path, name = Path(spec), None
    if not path.exists() and ":" in spec:
        head, tail = spec.rsplit(":", 1)
        if tail and "/" not in tail:
            path, name = Path(head), tail
    if name is None:  # the file name without .gz and its last suffix
        name = path.name.removesuffix(".gz").rsplit(".", 1)[0]
    if not name.strip():
        raise GenomeLMError(f"{FLAG} {spec!r}: give a non-empty NAME after ':' (FILE.bed[:NAME])")
    return path, name


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint (non-abutting) intervals covering the same bases; zero-length ones dropped."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    if len(starts) == 0:
        return starts, ends
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] > reach[:-1]  # an interval starting after all before it ended opens a new run
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(starts)) - 1
    return starts[first], reach[last]


def read_bed(path: Path, name: str) -> Annotation:
    """Parse and merge one BED file; a malformed line is a `GenomeLMError` naming the file and line."""
    if not path.is_file():
        raise GenomeLMError(f"{FLAG} {path}: no such file (give a BED file: chrom, start, end; 0-based half-open)")
    by_chrom: dict[str, list[tuple[int, int]]] = {}  # chromosome key -> (start, end) of each line
    names: dict[str, str] = {}
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip() or line.startswith(_SKIP):
                    continue
                fields = line.rstrip("\n").split("\t") if "\t" in line else line.split()
                where = f"{FLAG} {path}, line {lineno}"
                if len(fields) < 3:
                    raise GenomeLMError(f"{where}: {len(fields)} field(s); a BED line needs chrom, start, end")
                try:
                    s, e = int(fields[1]), int(fields[2])
                except ValueError:
                    raise GenomeLMError(f"{where}: start {fields[1]!r} / end {fields[2]!r} are not integers") from None
                if s < 0 or e < s:
                    raise GenomeLMError(f"{where}: interval [{s}, {e}) needs 0 <= start <= end (0-based, half-open)")
                names.setdefault(chrom_match_key(fields[0]), fields[0])
                by_chrom.setdefault(chrom_match_key(fields[0]), []).append((s, e))
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise GenomeLMError(f"{FLAG} {path}: cannot read it as a (gzipped) text BED file: {err}") from None
    intervals = {c: _merge(*np.asarray(v, np.int64).reshape(-1, 2).T) for c, v in by_chrom.items()}
    n = sum(map(len, by_chrom.values()))
    ann = Annotation(name, str(path), intervals, n, names)
    log.info("annotation %s: %s: %s intervals, %s bases on %d chromosome(s)", name, path, f"{n:,}",
             f"{ann.record()['bases']:,}", len(intervals))
    return ann


def load_annotations(specs: list[str]) -> list[Annotation]:
    """The `--annotate` values, parsed, in order; NAMEs must differ."""
    out: list[Annotation] = []
    for spec in specs:
        path, name = parse_spec(spec)
        if any(a.name == name for a in out):
            raise GenomeLMError(f"{FLAG} {spec!r}: NAME {name!r} is given twice; name them apart with "
                                "FILE.bed:NAME")
        out.append(read_bed(path, name))
    return out
