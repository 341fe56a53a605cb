"""`genome-lm prepare`: FASTA -> single-nucleotide tokens -> windows -> dataset shards + manifest.

A chromosome is cut into contigs at N runs (`scan`) and each contig into windows (`contig_windows`;
docs/prepare.md). One chromosome is in memory at a time (one uint8 code per base), plus one window. With
`--leakage-k` an eval chromosome read before the last training one is held in memory until the K-mer index
of the training chromosomes (`leakage.KmerIndex`) is complete."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from genome_lm import __version__
from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import FastaReader, Record
from genome_lm.genome.leakage import KmerIndex
from genome_lm.genome.params import PrepareParams, chrom_match_key
from genome_lm.genome.shards import (
    SplitWriter,
    check_shards,
    fingerprint_of,
    load_manifest,
    manifest_checksum,
)
from genome_lm.genome.tokenizer import (
    IUPAC_CODES,
    IUPAC_SHIFT,
    N_ID,
    SOFTMASK_BIT,
    TOKEN_MASK,
    VOCAB,
    reverse_complement,
)
from genome_lm.outputs import atomic_directory, file_digest, holding, write_json_atomic
from genome_lm.sizes import format_size

log = logging.getLogger(__name__)

RUN_BLOCK = 1 << 24  # bases per step of `scan`


def scan(codes: np.ndarray, min_gap: int = 1) -> tuple[list[tuple[int, int]], int, int, int, dict[str, int]]:
    """One blockwise pass over codes [T] (transient memory O(block)): the contigs [start, end) between N runs
    of at least `min_gap` bases, the bases in those runs, the N bases (IUPAC codes included), the soft-masked
    bases, and each ambiguity code's count."""
    edges = [np.zeros(0, dtype=np.int64)]  # where N runs start and end, alternating
    prev = False
    softmasked = 0
    iupac = np.zeros(16, dtype=np.int64)
    for b0 in range(0, len(codes), RUN_BLOCK):
        block = codes[b0 : b0 + RUN_BLOCK]
        isn = (block & TOKEN_MASK) == N_ID
        softmasked += int(np.count_nonzero(block & SOFTMASK_BIT))
        iupac += np.bincount(block[block >= (1 << IUPAC_SHIFT)] >> IUPAC_SHIFT, minlength=16)
        edges.append(np.flatnonzero(np.diff(isn, prepend=prev)).astype(np.int64) + b0)
        prev = bool(isn[-1])
    if prev:
        edges.append(np.array([len(codes)], dtype=np.int64))
    runs = np.concatenate(edges).reshape(-1, 2)
    gaps = runs[(runs[:, 1] - runs[:, 0]) >= min_gap]
    bounds = np.concatenate([[0], gaps.ravel(), [len(codes)]]).reshape(-1, 2).tolist()  # (end of a gap, next start)
    counts = {code: int(iupac[i]) for i, code in enumerate(IUPAC_CODES, start=1) if iupac[i]}
    return ([(s, e) for s, e in bounds if e > s], int((gaps[:, 1] - gaps[:, 0]).sum()),
            int((runs[:, 1] - runs[:, 0]).sum()), softmasked, counts)


def contig_windows(start: int, end: int, p: PrepareParams) -> tuple[list[tuple[int, int]], int]:
    """Windows inside the contig [start, end), and its bases no window covers because the tail was dropped."""
    assert p.stride is not None and p.min_len is not None, "PrepareParams._check fills them in"
    spans = [(s, s + p.seq_len) for s in range(start, end - p.seq_len + 1, p.stride)]
    s = start + len(spans) * p.stride  # where the tail starts
    covered = spans[-1][1] if spans else start
    if s < end and covered < end and p.tail == "keep" and end - s >= p.min_len:  # a tail [s, end) is kept
        spans.append((s, end))
        covered = end
    dropped_tail = max(0, end - covered) if p.stride <= p.seq_len or not spans else 0
    return spans, dropped_tail


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
    leakage_masked_tokens: int | None = None  #: eval tokens (of the windows written) in the leakage mask


def _check_output(out: Path, overwrite: bool, params: PrepareParams, readers: list[FastaReader]) -> dict | None:
    """The existing manifest if `out` already holds this exact result (a no-op rerun)."""
    if out.exists() and not out.is_dir():
        raise GenomeLMError(f"--out {out} is a file; choose a directory path")
    if not out.exists() or overwrite or not any(out.iterdir()):
        return None
    if not (out / "manifest.json").exists():
        raise GenomeLMError(f"--out {out} is not empty and holds no genome_lm shards (--overwrite replaces only "
                            "shards): choose another --out")
    existing = load_manifest(out)
    inputs = [(i["size"], i["sha256"]) for i in existing.get("inputs", [])]
    if existing.get("parameters") == params.recorded() and \
            inputs == [(r.info.size, file_digest(r.path)) for r in readers]:
        check_shards(out, existing)  # complete only if every split's files are there, whole
        return existing
    raise GenomeLMError(
        f"--out {out} already holds shards made from other inputs or parameters; pass --overwrite to replace them"
    )


def _check_chroms_present(params: PrepareParams, names_by_file: dict[str, list[str]]) -> None:
    present = {chrom_match_key(n) for names in names_by_file.values() for n in names}
    if missing := [c for c in params.train_chroms + params.eval_chroms if chrom_match_key(c) not in present]:
        listing = "; ".join(f"{Path(f).name}: {', '.join(n[:40])}{' …' if len(n) > 40 else ''}"
                            for f, n in names_by_file.items())
        raise GenomeLMError(
            f"chromosome {', '.join(missing)} not found in the FASTA input (records present — {listing}); "
            "fix --train-chroms/--eval-chroms or add the --fasta file that holds it"
        )


def _process_record(rec: Record, split: str, params: PrepareParams, writer: SplitWriter,
                    index: KmerIndex | None) -> ChromStats:
    """Cut `rec` into windows and write them, reverse-complement copies last; an eval record's rows get the
    leakage mask of the (finalized) `index`, and no reverse-complement copies."""
    leak = index.mask(rec.codes, rec.name) if index is not None and split == "eval" else None
    t0 = time.perf_counter()
    codes = rec.codes
    spans, gap_bases, n_bases, softmasked, iupac = scan(codes, params.min_gap)
    stats = ChromStats(split=split, source=rec.source, length=len(codes), n_bases=n_bases, softmasked_bases=softmasked,
                       iupac=iupac, contigs=len(spans), longest_contig=max((e - s for s, e in spans), default=0))
    stats.dropped_bases["gap"] = gap_bases
    kept = []  # (start, end, N fraction) of the windows written
    for c0, c1 in spans:
        windows, dropped_tail = contig_windows(c0, c1, params)
        stats.dropped_bases["tail"] += dropped_tail
        for s, e in windows:
            n_frac = np.count_nonzero((codes[s:e] & TOKEN_MASK) == N_ID) / (e - s)
            if n_frac > params.max_n_frac:
                stats.dropped_windows_n_frac += 1
                stats.dropped_bases["n_frac"] += e - s
            else:
                kept.append((s, e, n_frac))
    strands = "+-" if params.reverse_complement and split == "train" else "+"
    writer.open_shard()
    for strand in strands:
        for s, e, n_frac in kept:
            tokens, mask = codes[s:e] & TOKEN_MASK, codes[s:e] & SOFTMASK_BIT
            if strand == "-":
                tokens, mask = reverse_complement(tokens), mask[::-1]
            writer.add(rec.name, s, e, strand, tokens, np.packbits(mask), n_frac,
                       None if leak is None else np.packbits(leak[s:e]))
    stats.windows, stats.rc_windows = len(kept), len(kept) * (len(strands) - 1)
    stats.tokens = len(strands) * sum(e - s for s, e, _ in kept)
    if leak is not None:
        stats.leakage_masked_tokens = sum(int(np.count_nonzero(leak[s:e])) for s, e, _ in kept)
    log.info(
        "%s (%s): %s bp, %d contigs -> %d windows%s, %d dropped for N (%.1fs)",
        rec.name, split, f"{stats.length:,}", stats.contigs, stats.windows,
        f" + {stats.rc_windows} reverse-complement" if stats.rc_windows else "",
        stats.dropped_windows_n_frac, time.perf_counter() - t0,
    )
    return stats


def _why_no_windows(st: ChromStats, params: PrepareParams) -> str:
    if st.length == 0:
        return "its FASTA record is empty (0 bp)"
    if st.contigs == 0:
        return f"all of its {st.length:,} bases are N (no contig between runs of >= --min-gap {params.min_gap} N)"
    if st.dropped_windows_n_frac:
        return (f"each of its {st.dropped_windows_n_frac} windows has more than --max-n-frac {params.max_n_frac} "
                "N bases")
    return (f"its longest contig, {st.longest_contig:,} bases, is shorter than --min-len {params.min_len}"
            + (" (or its tail was dropped: --tail drop)" if params.tail == "drop" else ""))


def _leakage_manifest(index: KmerIndex, eval_split: dict) -> dict:
    """The manifest's `leakage_mask` section: what the column means and how much of eval it marks."""
    def counts(tokens: int, masked: int) -> dict:
        return {"tokens": tokens, "masked_tokens": masked, "fraction": masked / tokens if tokens else 0.0}

    per_chrom = {name: counts(c["tokens"], c["leakage_masked_tokens"]) for name, c in eval_split["per_chrom"].items()}
    total = counts(sum(c["tokens"] for c in per_chrom.values()), sum(c["masked_tokens"] for c in per_chrom.values()))
    return {
        "k": index.k, "split": "eval", "column": "leakage_mask", "encoding": "numpy.packbits", "bitorder": "big",
        "meaning": f"1 = the token lies in a {index.k}-mer [i, i + {index.k}) that occurs, on either strand, in a "
                   "training chromosome (K-mers with a base other than A/C/G/T are skipped; case is ignored); "
                   "in token order",
        "index": "sorted uint64 canonical K-mer codes (exact)", "false_positive_rate": 0.0,
        "train_chroms": index.sources, "train_kmers_distinct": len(index.codes),
        **total, "per_chrom": per_chrom,
    }


def prepare(params: PrepareParams, out: str | Path, overwrite: bool = False, show_progress: bool | None = None) -> dict:
    """Build the shard directory `out` and return its manifest (see module docstring)."""
    out = Path(out)
    with holding(out, "prepare"):
        readers = [FastaReader(path, show_progress=show_progress) for path in params.fasta]
        if (existing := _check_output(out, overwrite, params, readers)) is not None:
            log.info("%s is already complete for these inputs and parameters; nothing to do (--overwrite to rebuild)",
                     out)
            return existing
        if all(r.info.records for r in readers):  # every file indexed: check before reading
            _check_chroms_present(params, {r.info.path: r.info.records for r in readers})
        splits = [s for s, chroms in (("train", params.train_chroms), ("eval", params.eval_chroms)) if chroms]
        for split in {"train", "eval"} - set(splits):  # one at most
            log.warning("--%s-chroms is empty: the shards will hold no %s split, so genome-lm %s cannot read them",
                        split, split, split)
        index = KmerIndex(params.leakage_k, show_progress) if params.leakage_k else None
        t0 = time.perf_counter()
        with atomic_directory(out, "shards", params.fasta, overwrite=overwrite) as tmp:
            writers = {s: SplitWriter(tmp / s, leakage=index is not None and s == "eval",
                                      megatron=params.format == "megatron") for s in splits}
            stats = _write_records(readers, params, index, writers)
            _check_chroms_present(params, {r.info.path: r.info.records for r in readers})
            inputs = [{k: v for k, v in asdict(r.info).items() if k != "records"} for r in readers]
            manifest_splits = {split: _finish_split(split, stats, params, inputs, writers[split]) for split in splits}
            manifest = {
                "format": "genome_lm.shards/1",
                "genome_lm_version": __version__,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "inputs": inputs,
                "parameters": params.recorded(),
                "vocab": dict(VOCAB),
                "token_dtype": "uint8",
                "repeat_mask": {"encoding": "numpy.packbits", "bitorder": "big",
                                "meaning": "1 = soft-masked (lowercase) base in the source FASTA, in token order"},
                "coordinates": "0-based, half-open, forward strand; "
                               "strand '-' rows hold the reverse complement of [start, end)",
                "splits": manifest_splits,
            }
            if index is not None:
                manifest["leakage_mask"] = _leakage_manifest(index, manifest_splits["eval"])
            if params.format == "megatron":
                manifest["megatron"] = {s: f"megatron/{s}" for s in splits}
            manifest["checksum"] = manifest_checksum(manifest)
            write_json_atomic(tmp / "manifest.json", manifest)
        elapsed = time.perf_counter() - t0
        total = sum(i["size"] for i in inputs)
        summary = ", ".join(f"{s}: {m['windows']} windows / {m['tokens']:,} tokens" for s, m in manifest_splits.items())
        log.info("wrote %s in %.1fs (%.0f MB/s of FASTA): %s", out, elapsed, total / 1e6 / max(elapsed, 1e-9), summary)
        return manifest


def _write_records(readers: list[FastaReader], params: PrepareParams, index: KmerIndex | None,
                   writers: dict[str, SplitWriter]) -> dict[str, ChromStats]:
    """Write every selected record in input order (eval ones wait for the leakage index); returns their `ChromStats`."""
    stats: dict[str, ChromStats] = {}
    held: list[Record] = []  # eval records read before the index was complete
    claimed: dict[str, str] = {}  # match key -> the file holding the record
    for reader in readers:
        for rec in reader.records(lambda name: params.split_of(name) is not None):
            key = chrom_match_key(rec.name)
            if key in claimed:
                raise GenomeLMError(
                    f"chromosome {rec.name} appears in both {claimed[key]} and {rec.source}; pass each chromosome once"
                )
            claimed[key] = rec.source
            split = params.split_of(rec.name)
            assert split is not None, "records() yields only the records split_of places"
            train_left = [c for c in params.train_chroms if chrom_match_key(c) not in claimed]
            if split == "eval" and index is not None and not index.finalized:
                log.info("%s (eval): held in memory until the training chromosomes are indexed (%s to come)",
                         rec.name, ", ".join(train_left))
                held.append(rec)
                continue
            stats[rec.name] = _process_record(rec, split, params, writers[split], index)
            if split == "train" and index is not None:
                index.add(rec.codes, rec.name)
                if not train_left:
                    index.finalize()
                    while held:
                        rec = held.pop(0)
                        stats[rec.name] = _process_record(rec, "eval", params, writers["eval"], index)
            del rec
    return stats


def _finish_split(split: str, stats: dict[str, ChromStats], params: PrepareParams, inputs: list[dict],
                  writer: SplitWriter) -> dict:
    """Close `split`'s files and return its manifest entry; a split without windows is an error."""
    chrom_stats = {name: st for name, st in stats.items() if st.split == split}
    n_windows = sum(st.windows + st.rc_windows for st in chrom_stats.values())
    if n_windows == 0 and chrom_stats and all(st.contigs == 0 for st in chrom_stats.values()):
        raise GenomeLMError(f"the {split} split has no windows: "
                            + "; ".join(f"{name}: {_why_no_windows(st, params)}" for name, st in chrom_stats.items())
                            + f"; choose --{split}-chroms that hold sequence")
    if n_windows == 0:
        longest = max((st.longest_contig for st in chrom_stats.values()), default=0)
        raise GenomeLMError(
            f"the {split} split has no windows: --seq-len {format_size(params.seq_len)} with --min-len "
            f"{params.min_len} and --tail {params.tail} leaves nothing (longest contig: {longest:,} bases, "
            f"--max-n-frac {params.max_n_frac}); lower --seq-len or --min-len"
            + (", or use --tail keep" if params.tail == "drop" else "")
        )
    for name, st in chrom_stats.items():
        if st.windows == 0:
            log.warning("%s (%s) gives no window: %s", name, split, _why_no_windows(st, params))
    fp = fingerprint_of({"inputs": [i["sha256"] for i in inputs], "params": params.recorded(), "split": split})[:16]
    files = writer.finalize(fp, split)
    return {
        "chroms": list(chrom_stats),
        "windows": n_windows,
        "tokens": sum(st.tokens for st in chrom_stats.values()),
        "files": files,
        "file_bytes": {name: (writer.dir / name).stat().st_size for name in files},
        "per_chrom": {name: {k: v for k, v in asdict(st).items() if v is not None} for name, st in chrom_stats.items()},
    }


def prepare_command(params: PrepareParams, out) -> None:
    """`genome-lm prepare`: `out` its PrepareOutput (out, overwrite)."""
    prepare(params, out.out, overwrite=out.overwrite)
