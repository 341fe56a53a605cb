"""`genome-lm score`: per-base log-probs (and embeddings) of the regions of a FASTA, any length.

Each region not yet done, each strand, streams through the model in chunks of --chunk tokens, its rows and
embeddings written as they come into the work folder `PARENT/.NAME.score-work/` (`open_work`, `write_region`),
which is moved into a new OUT (`outputs.atomic_directory`) when the last region is done; a killed score rerun
with the same inputs scores only the regions not done (the files: docs/score.md). `--nproc N | --ray`:
`sharded.launch` runs `score` in every process of a `Job`."""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from genome_lm.errors import GenomeLMError
from genome_lm.outputs import atomic_directory, claim_output, write_json_atomic
from genome_lm.score.params import STRANDS, ScoreParams
from genome_lm.sizes import parse_size

log = logging.getLogger(__name__)
SCHEMA = pa.schema([("region", pa.string()), ("chrom", pa.string()), ("pos", pa.int64()), ("strand", pa.string()),
                    ("logp", pa.float32())] + [(f"logp_{b}", pa.float32()) for b in "acgt"])


@dataclass(frozen=True)
class Region:
    name: str
    chrom: str  # the FASTA's name
    start: int  # 0-based, half-open
    end: int


def load_regions(p: ScoreParams):
    """The reference (`genome.fasta.Reference`, only the contigs scored) and the regions, checked."""
    from genome_lm.genome.fasta import Reference

    lines: list[tuple[int, list[str]]] = []  # (line number, fields) of each interval line of --regions
    if p.regions:
        try:
            text = Path(p.regions).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise GenomeLMError(f"--regions {p.regions}: cannot read it ({getattr(e, 'strerror', None) or e}); give "
                                "a BED file of chrom, start, end[, name] lines") from None
        lines = [(n, line.split()) for n, line in enumerate(text.splitlines(), 1)
                 if line.strip() and not line.startswith(("#", "track", "browser"))]
        if not lines:
            raise GenomeLMError(f"--regions {p.regions} holds no region; give chrom, start, end[, name] lines")
    ref = Reference.load(p.fasta, [f[0] for _, f in lines] if p.regions else None, show_progress=False)
    if not p.regions:
        return ref, [Region(name, name, 0, len(ref.tokens(name))) for name in ref.all_names]
    regions = []
    for n, f in lines:
        try:
            start, end = int(f[1]), int(f[2])
        except (IndexError, ValueError):
            raise GenomeLMError(f"--regions {p.regions} line {n}: expected chrom, start, end[, name] (0-based, "
                                f"half-open), got {' '.join(f)!r}") from None
        chrom, length = ref.record(f[0]), len(ref.tokens(f[0]))
        if not 0 <= start < end:
            raise GenomeLMError(f"--regions {p.regions} line {n}: start {start}, end {end} is no region "
                                "(0 <= start < end, 0-based half-open)")
        if end > length:
            raise GenomeLMError(f"--regions {p.regions} line {n}: {f[0]}:{start}-{end} ends beyond {chrom} "
                                f"({length:,} bases in {p.fasta}); check the assembly the BED file was made for")
        regions.append(Region(f[3] if len(f) > 3 else f"{chrom}:{start}-{end}", chrom, start, end))
    return ref, regions


def check_inputs(p: ScoreParams):
    """One-line errors before anything is scored; claims --out (lock, `outputs.claim_output`). Returns
    (reference, regions)."""
    from genome_lm.genome.tokenizer import N_ID

    claim_output(p.out, "score", score_inputs(p), p.overwrite)
    for path, flag in ((p.checkpoint, "--checkpoint"), (p.fasta, "--fasta")):
        if not Path(path).exists():
            raise GenomeLMError(f"{flag} {path} does not exist")
    ref, regions = load_regions(p)
    for r in regions:
        if (ref.tokens(r.chrom)[r.start : r.end] == N_ID).all():
            raise GenomeLMError(f"region {r.name} ({r.chrom}:{r.start}-{r.end}) is all N: nothing to score; leave "
                                "it out of --regions")
    return ref, regions


def score_inputs(p: ScoreParams) -> list[Path]:
    return [Path(p.checkpoint), Path(p.fasta), *([Path(p.regions)] if p.regions else [])]


def trained_context(checkpoint: str) -> int | None:
    """The training seq_len of a run's checkpoint (RUN/config.yaml of RUN/checkpoints/step_N[/model]), else None."""
    import yaml

    for run in Path(checkpoint).resolve().parents[1:3]:
        try:
            return parse_size(yaml.safe_load((run / "config.yaml").read_text())["data"]["seq_len"])
        except (OSError, KeyError, TypeError, ValueError, GenomeLMError, yaml.YAMLError):
            continue
    return None


def rows_of(regions: list[Region], stride: int | None) -> np.ndarray:
    """Embedding rows [R + 1] where each region starts (the last: the total) for `stride` bases per row."""
    per = [1 if stride is None else -(-(r.end - r.start) // stride) for r in regions]
    return np.concatenate([[0], np.cumsum(per)]).astype(np.int64)


def score(p: ScoreParams, show_progress: bool | None = None, device: torch.device | str | None = None) -> dict:
    """Run the score `p` (one process, or every rank of a launch); return the summary rank 0 wrote."""
    from genome_lm.eval import sharded

    t0 = time.perf_counter()
    return sharded.on_ranks(p, "score", device, lambda p, par: _score(p, par, show_progress, t0))


def _score(p: ScoreParams, par, show_progress: bool | None, t0: float) -> dict:
    from genome_lm.eval import sharded
    from genome_lm.eval.run import checkpoint_record
    from genome_lm.genome.tokenizer import VOCAB
    from genome_lm.model import token_lut

    checked = par.on_main(lambda: check_inputs(p), share=False)  # no FASTA is broadcast: the other ranks read theirs
    ref, regions = checked if par.is_main else load_regions(p)
    ckpt = checkpoint_record(p.checkpoint)
    model = sharded.build_model(p, ckpt["model_dir"], par).eval()
    if bad := [i for i in p.embeddings if not 0 <= i < model.config.num_hidden_layers]:  # layers the model lacks
        raise GenomeLMError(f"--embeddings {','.join(map(str, bad))}: the model has decoder layers 0 to "
                            f"{model.config.num_hidden_layers - 1}; name layers in that range")
    lut = torch.from_numpy(token_lut(VOCAB, ckpt["model_dir"]))
    strands = STRANDS[p.strands]
    rows, bases = rows_of(regions, p.stride()), int(rows_of(regions, 1)[-1])
    key = {"checkpoint": ckpt, "fasta": {"path": str(Path(p.fasta).resolve()), "sha256": ref.sha256},
           "regions": [asdict(r) for r in regions], "strands": strands, "embeddings": p.embeddings,
           "pool": p.pool, "chunk": p.chunk, "dtype": p.dtype}
    work, done = open_work(Path(p.out), key) if par.is_main else (None, set())
    todo = par.broadcast_object([i for i in range(len(regions)) if i not in done])
    log.info("score %s: %d regions (%s bases) x %d strand(s), %d already done; chunks of %d tokens, %s",
             ckpt["model_dir"], len(regions), f"{bases:,}", len(strands), len(regions) - len(todo), p.chunk, p.dtype)
    _score_regions(p, par, model, ref, regions, todo, lut, rows, work, show_progress)
    trained = trained_context(p.checkpoint)
    summary = {"command": "score", "checkpoint": ckpt, "reference": key["fasta"], "regions": len(regions),
               "bases": bases, "strands": strands,
               "embeddings": {"layers": p.embeddings, "pool": p.pool, "dtype": "float16"},
               "chunk_tokens": p.chunk, "dtype": p.dtype, "trained_context": trained,
               "longer_than_trained": [r.name for r in regions if trained and r.end - r.start > trained],
               "seconds": round(time.perf_counter() - t0, 3)}
    return par.on_main(lambda: _finish(p, work, regions, rows, summary))


def _score_regions(p: ScoreParams, par, model, ref, regions: list[Region], todo: list[int], lut: torch.Tensor,
                   rows: np.ndarray, work: Path | None, show_progress: bool | None) -> None:
    """Score the regions `todo`, each strand of each, rank 0 writing them into `work`. One process streams
    each region (`engine.stream`); a launch scores one region per dp replica at a time, each in one forward
    split over its CP group (`engine.whole`), and gathers the rows on rank 0."""
    from genome_lm.eval import sharded
    from genome_lm.genome.tokenizer import N_ID, reverse_complement
    from genome_lm.parallel import callbacks
    from genome_lm.progress import progress
    from genome_lm.score.engine import head_weight, stream, whole

    strands = STRANDS[p.strands]
    paths = {(layer, s): work / "embeddings" / f"layer{layer}.{'forward' if s == '+' else 'reverse'}.npy"
             for layer in p.embeddings for s in strands} if work else {}
    files = {k: np.lib.format.open_memmap(f, mode="r+" if f.exists() else "w+", dtype=np.float16,  # made, or resumed
                                          shape=(int(rows[-1]), model.config.hidden_size)) for k, f in paths.items()}
    weight = head_weight(model)

    def chunks(i: int, strand: str):
        r = regions[i]
        tokens = ref.tokens(r.chrom)[r.start : r.end]
        seq = torch.from_numpy(tokens if strand == "+" else reverse_complement(tokens)).long()  # [T]
        for c in (whole if par.distributed else stream)(model, lut[seq], lut[:4], p.chunk, p.embeddings, weight):
            c.logp[seq[c.start : c.start + len(c.logp)].to(c.logp.device) == N_ID] = float("nan")  # N: no base
            if not par.distributed:
                bar.update(len(c.logp))  # a launch counts each region when rank 0 has it
            yield c

    def scored(i: int) -> dict:  # one process: each strand's chunks as they are written; a launch: gathered
        return {s: [c.cpu() for c in chunks(i, s)] if par.distributed else chunks(i, s) for s in strands}

    lengths = np.array([r.end - r.start for r in regions], dtype=np.int64) * len(strands)
    with progress(int(lengths.sum()), int(lengths.sum() - lengths[todo].sum()), f"score {Path(p.out).name}",
                  "bases", disable=not par.is_main or show_progress is False, unit_scale=True) as bar:
        for n, (i, by_strand) in enumerate(chain.from_iterable(
                sharded.scored_rounds(par, model, todo, [len(strands)] * len(regions), scored)), 1):
            assert work is not None, "one process, or rank 0 of a launch, writes"
            write_region(work, i, regions[i], by_strand, files, int(rows[i]), p.stride())
            if par.distributed:
                bar.update(int(lengths[i]))
            callbacks.after_step(n, par.rank, 0)  # a region done (tests kill a score here)


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
        write_json_atomic(work / "key.json", key)
    (work / "logp").mkdir(exist_ok=True)
    (work / "embeddings").mkdir(exist_ok=True)
    return work, {int(p.name) for p in (work / "done").iterdir()}


def write_region(work: Path, index: int, region, by_strand: dict, files: dict, row: int, stride: int | None) -> None:
    """One region's rows from its engine `Chunk`s (`by_strand`: strand -> chunks, positions along the scored
    sequence), chunk by chunk: per-base rows to its Parquet file, embeddings into the memmaps `files` from
    `row` on (`stride` 1), or summed per bin of `stride` bases (None: one bin) and written as means. Then the
    memmaps are flushed, the Parquet file is renamed into place and the region marked done."""
    path = work / "logp" / f"r{index:06d}.parquet"
    tmp = path.with_name(f".{path.name}.tmp")
    length = region.end - region.start
    bins = 1 if stride is None else -(-length // stride)
    sums = {k: torch.zeros(bins, m.shape[1], dtype=torch.float64) for k, m in files.items()} if stride != 1 else {}
    with pq.ParquetWriter(tmp, SCHEMA) as writer:
        for strand, chunk in ((strand, c) for strand, chunks in by_strand.items() for c in chunks):
            n = len(chunk.logp)
            rel = np.arange(chunk.start, chunk.start + n)
            rel = rel if strand == "+" else length - 1 - rel
            acgt = chunk.logp_acgt.cpu().numpy()
            cols = [pa.repeat(region.name, n), pa.repeat(region.chrom, n), pa.array(region.start + rel),
                    pa.repeat(strand, n), pa.array(chunk.logp.cpu().numpy()), *(pa.array(a) for a in acgt.T)]
            writer.write_table(pa.Table.from_arrays(cols, schema=SCHEMA))  # one row group per chunk
            for layer, emb in chunk.embeddings.items():
                if stride == 1:
                    lo = int(rel.min())
                    files[layer, strand][row + lo : row + lo + n] = \
                        (emb if strand == "+" else emb.flip(0)).cpu().numpy().astype(np.float16)
                else:
                    bin_of = torch.from_numpy(rel // stride if stride else np.zeros_like(rel))
                    sums[layer, strand].index_add_(0, bin_of, emb.cpu().double())
    counts = torch.from_numpy(np.minimum(stride or length, length - np.arange(bins) * (stride or 0)))  # [bins]
    for key, s in sums.items():
        files[key][row : row + len(s)] = (s / counts[:, None]).numpy().astype(np.float16)
    for m in files.values():
        m.flush()
    tmp.replace(path)
    (work / "done" / f"{index:06d}").touch()


def _finish(p: ScoreParams, work: Path | None, regions: list[Region], rows: np.ndarray, summary: dict) -> dict:
    """Move the work folder's files into a new OUT with regions.parquet and summary.json."""
    assert work is not None, "rank 0 holds the work folder"
    with atomic_directory(p.out, "score", score_inputs(p), overwrite=p.overwrite) as tmp:
        (work / "key.json").unlink()  # files leave the work folder: after a failure here a rerun starts anew
        for name in ("logp", "embeddings"):
            (work / name).replace(tmp / name)
        table: dict = {k: [getattr(r, k) for r in regions] for k in ("name", "chrom", "start", "end")}
        table.update(row=rows[:-1], rows=np.diff(rows))
        pq.write_table(pa.table(table).rename_columns(["region", "chrom", "start", "end", "row", "rows"]),
                       tmp / "regions.parquet")
        write_json_atomic(tmp / "summary.json", summary)
    shutil.rmtree(work, ignore_errors=True)
    log.info("score done: %d regions, %s bases -> %s", summary["regions"], f"{summary['bases']:,}", p.out)
    return summary


def worker(params: dict, device=None, worker=None) -> dict:
    """Every process of a distributed score (module level: the launchers pickle it)."""
    return score(ScoreParams(**params), device=device)


def score_command(p: ScoreParams, run) -> str:
    """`genome-lm score`: one process, or `score(p)` on every process of a `sharded.launch` (--nproc, --ray)."""
    from genome_lm.eval import sharded

    if run.ray is None and (run.nproc or 1) <= 1:
        s = score(p)
    else:
        sharded.launch(p, "score", worker, check_inputs, lambda out: f"Regions scored so far are kept in "
                       f"{work_dir_for(out)}; rerun the same command to continue", run.nproc, run.ray)
        s = json.loads((Path(p.out) / "summary.json").read_text())
    return (f"score: {s['regions']} region(s), {s['bases']:,} bases x {len(s['strands'])} strand(s) -> {p.out}"
            + (f"; longer than the trained context ({s['trained_context']:,}): {', '.join(s['longer_than_trained'])}"
               if s["longer_than_trained"] else ""))
