"""`genome-lm prepare`: FASTA -> single-nucleotide tokens -> windows -> dataset shards + manifest.

One chromosome is in memory at a time (as one uint8 code per base, see `tokenizer`), plus one
window. The output is built in a hidden temporary directory beside `--out` and renamed into
place when complete, so an interrupted run never leaves anything that looks finished.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from genome_lm import __version__
from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import FastaReader, Record
from genome_lm.genome.shards import MegatronWriter, SplitWriter, fingerprint_of, load_manifest
from genome_lm.genome.tokenizer import (
    N_ID,
    SOFTMASK_BIT,
    TOKEN_DTYPE,
    TOKEN_MASK,
    VOCAB,
    reverse_complement,
)
from genome_lm.genome.windows import WindowSpec, contig_windows, contigs, scan
from genome_lm.utils import atomic_directory, format_size, parse_size, write_json_atomic

log = logging.getLogger(__name__)

MANIFEST_FORMAT = "genome_lm.shards/1"


def chrom_match_key(name: str) -> str:
    """The key chromosome names are matched by: no 'chr' prefix, lowercase ('chr22', 'Chr22', '22' -> '22')."""
    n = name.strip()
    return (n[3:] if n.lower().startswith("chr") else n).lower()


@dataclass
class PrepareParams:
    fasta: list[str]
    train_chroms: list[str]
    eval_chroms: list[str]
    seq_len: int
    stride: int
    min_gap: int = 1000
    max_n_frac: float = 0.05
    tail: str = "keep"
    min_len: int = 1
    reverse_complement: bool = False
    format: str = "hf"

    def __post_init__(self) -> None:
        if not self.fasta:
            raise GenomeLMError("no input: pass at least one --fasta FILE")
        if self.seq_len < 1:
            raise GenomeLMError(f"--seq-len must be at least 1 (got {self.seq_len})")
        if self.stride < 1:
            raise GenomeLMError(f"--stride must be at least 1 (got {self.stride})")
        if self.min_gap < 1:
            raise GenomeLMError(f"--min-gap must be at least 1 (got {self.min_gap})")
        if not 0.0 <= self.max_n_frac <= 1.0:
            raise GenomeLMError(f"--max-n-frac must lie in [0, 1] (got {self.max_n_frac})")
        if self.tail not in ("keep", "drop"):
            raise GenomeLMError(f"--tail must be keep or drop (got {self.tail!r})")
        if not 1 <= self.min_len <= self.seq_len:
            raise GenomeLMError(f"--min-len must lie in [1, --seq-len={self.seq_len}] (got {self.min_len})")
        if self.format not in ("hf", "megatron"):
            raise GenomeLMError(f"--format must be hf or megatron (got {self.format!r})")
        if not self.train_chroms and not self.eval_chroms:
            raise GenomeLMError("no chromosomes requested: set --train-chroms and/or --eval-chroms")
        for flag, chroms in (("--train-chroms", self.train_chroms), ("--eval-chroms", self.eval_chroms)):
            norms = [chrom_match_key(c) for c in chroms]
            if len(set(norms)) != len(norms):
                raise GenomeLMError(f"{flag} names a chromosome twice: {','.join(chroms)}")
        both = {chrom_match_key(c) for c in self.train_chroms} & {chrom_match_key(c) for c in self.eval_chroms}
        if both:
            names = ", ".join(c for c in self.train_chroms if chrom_match_key(c) in both)
            raise GenomeLMError(f"chromosome {names} is in both --train-chroms and --eval-chroms; "
                                "held-out data must not be trained on")

    @classmethod
    def from_cli(cls, *, fasta, train_chroms, eval_chroms, seq_len, stride=None, min_gap="1000", max_n_frac=0.05,
                 tail="keep", min_len=None, reverse_complement=False, format="hf") -> "PrepareParams":
        split = lambda s: [c.strip() for c in (s.split(",") if isinstance(s, str) else s) if c.strip()]  # noqa: E731
        L = parse_size(seq_len, "--seq-len")
        return cls(
            fasta=[str(f) for f in fasta],
            train_chroms=split(train_chroms),
            eval_chroms=split(eval_chroms),
            seq_len=L,
            stride=parse_size(stride, "--stride") if stride is not None else L,
            min_gap=parse_size(min_gap, "--min-gap"),
            max_n_frac=float(max_n_frac),
            tail=tail,
            min_len=parse_size(min_len, "--min-len") if min_len is not None else max(1, L // 8),
            reverse_complement=bool(reverse_complement),
            format=format,
        )

    def recorded(self) -> dict:
        """The parameters as the manifest records them (input files are recorded separately)."""
        d = asdict(self)
        d.pop("fasta")
        return d

    def split_of(self, record_name: str) -> str | None:
        n = chrom_match_key(record_name)
        if n in {chrom_match_key(c) for c in self.train_chroms}:
            return "train"
        if n in {chrom_match_key(c) for c in self.eval_chroms}:
            return "eval"
        return None


@dataclass
class ChromStats:
    split: str
    source: str
    length: int = 0
    n_bases: int = 0
    softmasked_bases: int = 0
    iupac: dict = field(default_factory=dict)
    contigs: int = 0
    longest_contig: int = 0
    windows: int = 0
    rc_windows: int = 0
    tokens: int = 0
    dropped_windows_n_frac: int = 0
    dropped_bases: dict = field(default_factory=lambda: {"gap": 0, "tail": 0, "n_frac": 0})


def _check_output(out: Path, overwrite: bool, params: PrepareParams, readers: list[FastaReader]) -> dict | None:
    """Return the existing manifest if `out` already holds this exact result (a no-op rerun)."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise GenomeLMError(f"--out {out} is a file; choose a directory path")
    if overwrite or not any(out.iterdir()):
        return None
    if not (out / "manifest.json").exists():
        raise GenomeLMError(f"--out {out} is not empty and holds no genome_lm shards; "
                            "pass --overwrite or choose another --out")
    existing = load_manifest(out)
    same_params = existing.get("parameters") == params.recorded()
    from genome_lm.utils import sha256_file

    same_inputs = [(i["size"], i["sha256"]) for i in existing.get("inputs", [])] == [
        (r.size, sha256_file(r.path)) for r in readers
    ] if same_params else False
    if same_params and same_inputs:
        return existing
    raise GenomeLMError(
        f"--out {out} already holds shards made from other inputs or parameters; pass --overwrite to replace them"
    )


def _check_chroms_present(params: PrepareParams, names_by_file: dict[str, list[str]]) -> None:
    present = {chrom_match_key(n): n for names in names_by_file.values() for n in names}
    missing = [c for c in params.train_chroms + params.eval_chroms if chrom_match_key(c) not in present]
    if missing:
        listing = "; ".join(f"{Path(f).name}: {', '.join(n[:40])}{' …' if len(n) > 40 else ''}"
                            for f, n in names_by_file.items())
        raise GenomeLMError(
            f"chromosome {', '.join(missing)} not found in the FASTA input (records present — {listing}); "
            "fix --train-chroms/--eval-chroms or add the --fasta file that holds it"
        )


def _window_rows(rec: Record, spec: WindowSpec, params: PrepareParams, stats: ChromStats, gaps=None):
    """Yield (start, end, tokens, packed mask, n_frac) for the kept forward windows of `rec`."""
    codes = rec.codes
    gaps = scan(codes, params.min_gap).gaps if gaps is None else gaps
    stats.dropped_bases["gap"] = int((gaps[:, 1] - gaps[:, 0]).sum())
    spans = contigs(len(codes), gaps)
    stats.contigs = len(spans)
    stats.longest_contig = max((e - s for s, e in spans), default=0)
    for c0, c1 in spans:
        windows, dropped_tail = contig_windows(c0, c1, spec)
        stats.dropped_bases["tail"] += dropped_tail
        for s, e in windows:
            win = codes[s:e]
            tokens = win & TOKEN_MASK
            n_frac = np.count_nonzero(tokens == N_ID) / len(tokens)
            if n_frac > params.max_n_frac:
                stats.dropped_windows_n_frac += 1
                stats.dropped_bases["n_frac"] += e - s
                continue
            yield s, e, tokens, np.packbits(win & SOFTMASK_BIT), n_frac


def _process_record(rec: Record, split: str, spec: WindowSpec, params: PrepareParams, writers, mwriters) -> ChromStats:
    t0 = time.perf_counter()
    codes = rec.codes
    found = scan(codes, params.min_gap)
    stats = ChromStats(split=split, source=rec.source, length=len(codes), n_bases=found.n_bases,
                       softmasked_bases=found.softmasked_bases, iupac=found.iupac)
    writer = writers[split]
    writer.open_shard()
    rc_rows = []
    for s, e, tokens, packed_mask, n_frac in _window_rows(rec, spec, params, stats, found.gaps):
        writer.add(rec.name, s, e, "+", tokens, packed_mask, n_frac)
        if split in mwriters:
            mwriters[split].add(tokens)
        stats.windows += 1
        stats.tokens += len(tokens)
        if params.reverse_complement and split == "train":
            rc_rows.append((s, e, n_frac))
    for s, e, n_frac in rc_rows:  # reverse-complement copies after the forward windows
        win = codes[s:e]
        tokens = reverse_complement(win & TOKEN_MASK)
        mask = (win & SOFTMASK_BIT)[::-1]
        writer.add(rec.name, s, e, "-", tokens, np.packbits(mask), n_frac)
        if split in mwriters:
            mwriters[split].add(tokens)
        stats.rc_windows += 1
        stats.tokens += len(tokens)
    log.info(
        "%s (%s): %s bp, %d contigs -> %d windows%s, %d dropped for N (%.1fs)",
        rec.name, split, f"{stats.length:,}", stats.contigs, stats.windows,
        f" + {stats.rc_windows} reverse-complement" if stats.rc_windows else "",
        stats.dropped_windows_n_frac, time.perf_counter() - t0,
    )
    return stats


def prepare(params: PrepareParams, out: str | Path, overwrite: bool = False, show_progress: bool | None = None) -> dict:
    """Build the shard directory `out` and return its manifest (see module docstring)."""
    out = Path(out)
    readers = [FastaReader(path, show_progress=show_progress) for path in params.fasta]
    if (existing := _check_output(out, overwrite, params, readers)) is not None:
        log.info("%s is already complete for these inputs and parameters; nothing to do (--overwrite to rebuild)", out)
        print(f"{out}: already complete for these inputs and parameters; nothing to do")
        return existing
    known = {str(r.path): r.names() for r in readers}
    if all(v is not None for v in known.values()):
        _check_chroms_present(params, known)

    spec = WindowSpec(params.seq_len, params.stride, params.tail, params.min_len)
    splits = [s for s, chroms in (("train", params.train_chroms), ("eval", params.eval_chroms)) if chroms]
    stats: dict[str, ChromStats] = {}
    t0 = time.perf_counter()
    with atomic_directory(out, overwrite=overwrite) as tmp:
        writers = {s: SplitWriter(tmp / s) for s in splits}
        mwriters = {}
        if params.format == "megatron":
            (tmp / "megatron").mkdir()
            mwriters = {s: MegatronWriter(tmp / "megatron" / s) for s in splits}
        claimed: dict[str, str] = {}
        for reader in readers:
            for rec in reader.records(lambda name: params.split_of(name) is not None):
                key = chrom_match_key(rec.name)
                if key in claimed:
                    raise GenomeLMError(
                        f"chromosome {rec.name} appears in both {claimed[key]} and {rec.source}; "
                        "pass each chromosome once"
                    )
                claimed[key] = rec.source
                stats[rec.name] = _process_record(rec, params.split_of(rec.name), spec, params, writers, mwriters)
                del rec
        _check_chroms_present(params, {r.info.path: r.info.records for r in readers})
        inputs = [
            {"path": r.info.path, "size": r.info.size, "sha256": r.info.sha256, "compression": r.info.compression}
            for r in readers
        ]
        manifest_splits = {}
        for split in splits:
            chrom_stats = {name: st for name, st in stats.items() if st.split == split}
            n_windows = sum(st.windows + st.rc_windows for st in chrom_stats.values())
            if n_windows == 0:
                longest = max((st.longest_contig for st in chrom_stats.values()), default=0)
                raise GenomeLMError(
                    f"the {split} split has no windows: --seq-len {format_size(params.seq_len)} with --min-len "
                    f"{params.min_len} and --tail {params.tail} leaves nothing (longest contig: {longest:,} bases, "
                    f"--max-n-frac {params.max_n_frac}); lower --seq-len or --min-len, or use --tail keep"
                )
            fp = fingerprint_of({"inputs": [i["sha256"] for i in inputs], "params": params.recorded(), "split": split})
            files = writers[split].finalize(fp, split)
            if split in mwriters:
                mwriters[split].finalize()
            manifest_splits[split] = {
                "chroms": list(chrom_stats),
                "windows": n_windows,
                "tokens": sum(st.tokens for st in chrom_stats.values()),
                "files": files,
                "per_chrom": {name: asdict(st) for name, st in chrom_stats.items()},
            }
        manifest = {
            "format": MANIFEST_FORMAT,
            "genome_lm_version": __version__,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "inputs": inputs,
            "parameters": params.recorded(),
            "vocab": dict(VOCAB),
            "token_dtype": np.dtype(TOKEN_DTYPE).name,
            "repeat_mask": {"encoding": "numpy.packbits", "bitorder": "big",
                            "meaning": "1 = soft-masked (lowercase) base in the source FASTA, in token order"},
            "coordinates": "0-based, half-open, forward strand; "
                           "strand '-' rows hold the reverse complement of [start, end)",
            "splits": manifest_splits,
        }
        if mwriters:
            manifest["megatron"] = {s: f"megatron/{s}" for s in mwriters}
        write_json_atomic(tmp / "manifest.json", manifest)
    elapsed = time.perf_counter() - t0
    total = sum(i["size"] for i in inputs)
    summary = ", ".join(f"{s}: {m['windows']} windows / {m['tokens']:,} tokens" for s, m in manifest_splits.items())
    log.info("wrote %s in %.1fs (%.0f MB/s of FASTA): %s", out, elapsed, total / 1e6 / max(elapsed, 1e-9), summary)
    return manifest
