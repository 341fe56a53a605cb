"""`genome-lm eval`: check the inputs (`check_inputs`), score every window the per-window cache lacks
(`outputs.WindowCache`), then write tokens.parquet and summary.json and drop the cache (`_write_outputs`). Every
rank of a distributed eval (`launch`, `sharded.py`) runs it; rank 0 checks and writes."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from genome_lm.errors import GenomeLMError
from genome_lm.eval import ablation, sharded, stats
from genome_lm.eval.annotate import load_annotations
from genome_lm.eval.config import EvalConfig
from genome_lm.eval.outputs import SUMMARY_FILE, RowWriter, TokensWriter, WindowCache, cache_dir_for, load_summary
from genome_lm.eval.scoring import ENGINES, ParityTable, score_window
from genome_lm.eval.stats import StrataAccumulator, bucket_edges, contexts_of, summarize
from genome_lm.genome.prepare import chrom_match_key
from genome_lm.genome.tokenizer import reverse_complement, unpack_mask
from genome_lm.outputs import atomic_directory, claim_output, file_digest, write_json_atomic
from genome_lm.parallel.launch import WorkerContext
from genome_lm.progress import progress
from genome_lm.settings import set_tf32

log = logging.getLogger(__name__)
HASH_WEIGHTS_UP_TO = 2 << 30  # hash checkpoint weights up to this size; larger ones by size/mtime


def checkpoint_record(checkpoint: str) -> dict:
    """Where the model came from: resolved model dir, config hash, weights hash (or file stats)."""
    from genome_lm.train.checkpoint import resolve_model_dir

    model_dir = resolve_model_dir(checkpoint).resolve()
    weights = sorted(model_dir.glob("*.safetensors"))
    on_disk: list[dict[str, Any]] = [{"file": p.name, "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
                                     for p in weights]
    record = {"path": str(checkpoint), "model_dir": str(model_dir),
              "config_sha256": file_digest(model_dir / "config.json"), "weights": on_disk}
    if sum(s["size"] for s in on_disk) <= HASH_WEIGHTS_UP_TO:  # sha256 of the files' hex digests, in name order
        record["weights_sha256"] = hashlib.sha256("".join(file_digest(p) for p in weights).encode()).hexdigest()
    return record


def check_inputs(cfg: EvalConfig) -> list:
    """One-line errors for the inputs before anything is scored or written; returns the annotations."""
    if not cfg.shards:
        raise GenomeLMError("--shards: give the directory written by `genome-lm prepare`")
    if not cfg.out:
        raise GenomeLMError("--out: give the output directory (tokens.parquet, summary.json)")
    claim_output(cfg.out, "eval", eval_inputs(cfg), cfg.overwrite)
    if cfg.split == "train":
        log.warning("--split train: scoring the chromosomes the model trained on; the loss measures fit, not "
                    "generalisation (the held-out split is eval)")
    if cfg.window_pick != "first" and cfg.max_windows is None:
        log.warning("--window-pick %s without --max-windows: every window of the split is scored, so the pick has "
                    "no effect (give --max-windows N to score N windows spread over the split)", cfg.window_pick)
    if cfg.ablation_targets is not None and not cfg.context:
        log.warning("--ablation-targets %d without --context: no context ablation is run (give --context L1,L2,... "
                    "to score the last targets at each context length)", cfg.ablation_targets)
    if not Path(cfg.checkpoint).exists():
        raise GenomeLMError(f"--checkpoint {cfg.checkpoint} does not exist; point it to a run's checkpoints/last "
                            "or a model directory")
    manifest, _, _, lengths = scored_windows(cfg)
    if cfg.seq_len and cfg.seq_len > lengths.max():
        whole = lengths.max() < int(manifest["parameters"].get("seq_len", 0))  # windows cut short by their contigs
        log.warning("--seq-len %d is longer than every window scored (at most %d tokens): each is scored whole, so no "
                    "token has more than %d tokens of context (%s)", cfg.seq_len, lengths.max(), lengths.max() - 1,
                    "the chromosomes hold no N-free stretch longer than that" if whole
                    else "prepare longer windows for more")
    sharded.check_pieces(lengths, int(cfg.seq_len or lengths.max()), cfg.cp)
    if cfg.context:
        ablation.plan(lengths, cfg.context, cfg.ablation_targets, cfg.seq_len, cfg.cp)
    annotations = load_annotations(cfg.annotate)
    check_annotations(annotations, manifest["splits"][cfg.split].get("chroms", []), cfg.split)
    return annotations


def check_annotations(annotations: list, chroms: list[str], split: str) -> None:
    """Refuse a BED file with no interval, or none on a chromosome of the split (an empty "in" stratum)."""
    keys = {chrom_match_key(c) for c in chroms}
    for a in annotations:
        if not any(len(s) for s, _ in a.intervals.values()):
            raise GenomeLMError(f"--annotate {a.path}: holds no interval of one base or more (lines that are empty, "
                                "comments, headers or start == end); give a BED file with chrom, start, end lines")
        if not keys & {k for k, (s, _) in a.intervals.items() if len(s)}:
            bed = ", ".join(sorted(a.names.get(k, k) for k in a.intervals)[:5]) \
                + (" ..." if len(a.intervals) > 5 else "")
            raise GenomeLMError(f"--annotate {a.path}: no interval lies on a chromosome of the {split} split "
                                f"({', '.join(chroms)}); the file names {bed}. Give a BED file for the scored "
                                "chromosomes")


def eval_inputs(cfg: EvalConfig) -> list[Path]:
    """What an eval reads (the checkpoint, the shards, the BED files): none may lie inside its --out."""
    beds = [Path(spec.rsplit(":", 1)[0] if ":" in Path(spec).name else spec) for spec in cfg.annotate]
    return [Path(cfg.checkpoint), *([Path(cfg.shards)] if cfg.shards else []), *beds]


def scored_windows(cfg: EvalConfig) -> tuple[dict, Any, np.ndarray, np.ndarray]:
    """The shard directory's manifest, the split to score (a `datasets.Dataset`), and the rows [W] of it that
    the eval scores (`window_indices`) with their tokens [W]."""
    from genome_lm.genome.shards import load_manifest, load_shards

    assert cfg.shards is not None, "every caller refuses an eval without --shards first"
    manifest = load_manifest(cfg.shards)
    split = load_shards(cfg.shards, cfg.split)
    if len(split) == 0:
        raise GenomeLMError(f"{cfg.shards}/{cfg.split} has no windows to score")
    rows = window_indices(len(split), cfg.max_windows, cfg.window_pick)
    ends = split.select_columns(["start", "end"]).select(rows)
    return manifest, split, rows, (np.asarray(ends["end"]) - np.asarray(ends["start"])).astype(np.int64)


def window_indices(n_split: int, max_windows: int | None, pick: Literal["first", "spread"] = "first") -> np.ndarray:
    """Rows [W] of a split of `n_split` windows that an eval scores, increasing: all of them without
    `max_windows`; else the first `max_windows` ("first"), or `max_windows` rows spaced evenly over the
    split, each at the middle of its stretch ("spread": row floor((i + 1/2) * n_split / W))."""
    n = n_split if max_windows is None else min(max_windows, n_split)
    if pick == "spread" and n < n_split:
        return ((np.arange(n) + 0.5) * n_split / n).astype(np.int64)  # stretches of >= 1 row: strictly increasing
    return np.arange(n, dtype=np.int64)


def evaluate(cfg: EvalConfig, show_progress: bool | None = None, device: torch.device | str | None = None,
             attempt: int = 0) -> dict:
    """Run the eval `cfg` on this process (one rank of a launch, whose `attempt` the step callbacks get);
    return the summary rank 0 writes. dtype: `cfg.dtype`, else float32 on CPU and bfloat16 on CUDA."""
    t0 = time.perf_counter()
    sharded.check(cfg, sharded.world_size())
    return sharded.on_ranks(cfg, "eval", device, lambda cfg, par: _evaluate(cfg, par, show_progress, t0, attempt))


def worker(cfg_json: dict, device=None, worker: WorkerContext | None = None) -> dict:
    """Every process of a distributed eval (module level: the launchers pickle it)."""
    return evaluate(EvalConfig(**cfg_json), device=device, attempt=worker.attempt if worker else 0)


def launch(cfg: EvalConfig, nproc: int | None, ray: str | None | bool = None, max_restarts: int = 0) -> dict:
    """`genome-lm eval --nproc N | --ray [ADDRESS]`: `evaluate(cfg)` on every process of a `sharded.launch`
    (a restart scores only the windows the cache lacks); returns the summary rank 0 wrote."""
    sharded.check_engine(cfg)  # one-line errors before any process starts
    sharded.launch(cfg, "eval", worker, check_inputs, lambda out: f"Windows scored so far are kept in "
                   f"{cache_dir_for(out)}; rerun the same command to continue", nproc, ray, max_restarts)
    assert cfg.out is not None, "sharded.launch refuses an eval without --out"
    return load_summary(cfg.out)


def _evaluate(cfg: EvalConfig, par, show_progress: bool | None, t0: float, attempt: int) -> dict:
    if par.device.type == "cuda":
        set_tf32(cfg.tf32)
    annotations = par.on_main(lambda: check_inputs(cfg), share=False)  # rank 0's: BED files parsed once, not sent
    assert cfg.out is not None, "check_inputs refuses an eval without --out, on every rank (on_main)"
    out = Path(cfg.out)
    manifest, split, rows, lengths = scored_windows(cfg)  # rows [W]: the split's rows scored
    ckpt = par.on_main(lambda: checkpoint_record(cfg.checkpoint))
    ds, n = split.select(rows), len(rows)  # window i of this eval = row rows[i] of the split
    seq_len = int(cfg.seq_len or lengths.max())
    edges = bucket_edges(cfg.buckets, max_context=int(min(seq_len, lengths.max())) - 1)
    engines = [cfg.engine] + [e for e in ENGINES if cfg.parity and e != cfg.engine]  # --parity: both
    targets = ablation.plan(lengths, cfg.context, cfg.ablation_targets, cfg.seq_len, par.cp) if cfg.context \
        else np.zeros(n, dtype=np.int64)  # [W] ablation targets per window, 0: none
    key = _cache_key(cfg, ckpt, par, seq_len, engines, targets, rows)
    cache = WindowCache(out, key) if par.is_main else None  # rank 0's: it alone writes

    todo = par.broadcast_object([i for i in range(n) if not cache.has(i)] if cache is not None else None)
    log.info("eval %s on %s/%s: %d windows%s (%s tokens), seq_len %d, engine %s%s, %s on %d process%s (dp %d x cp %d); "
             "%d already cached", ckpt["model_dir"], cfg.shards, cfg.split, n,
             "" if n == len(split) else f" of {len(split)} ({cfg.window_pick})", f"{int(lengths.sum()):,}", seq_len,
             cfg.engine, " + parity" if cfg.parity else "", cfg.dtype, par.world, "es" if par.world > 1 else "",
             par.dp, par.cp, n - len(todo))
    t_score = time.perf_counter()
    scored_tokens = _score(cfg, par, attempt, ckpt["model_dir"], manifest["vocab"], ds, lengths, targets, todo,
                           seq_len, engines, cache, show_progress) if todo else 0
    t_score = time.perf_counter() - t_score

    extra = {
        "checkpoint": ckpt,
        "shards": {"path": str(cfg.shards), "split": cfg.split, "manifest_sha256": key["manifest_sha256"],
                   "n_windows": n, "n_windows_in_split": len(split), "window_pick": cfg.window_pick,
                   "genome": [{"file": Path(i["path"]).name, "sha256": i["sha256"]} for i in manifest["inputs"]],
                   "parameters": manifest["parameters"]},
        "config": {**cfg.model_dump(), "seq_len": seq_len, "seq_len_requested": cfg.seq_len,
                   "bucket_edges": edges.tolist(), "engines": engines,
                   "parallel": {"world": par.world, "dp": par.dp, "cp": par.cp}},
        "timing": {"elapsed_s": time.perf_counter() - t0, "scored_tokens": scored_tokens,
                   "tokens_per_s": scored_tokens / t_score if scored_tokens else None},
    }

    summary = par.on_main(lambda: _write_outputs(cfg, out, ds, rows, seq_len, edges, cache, engines, extra,
                                                 annotations, targets))
    o = summary["overall"]
    log.info("eval done: mean NLL %.4f nats/token (%.4f bits/base) over %s tokens -> %s", o["mean_nll"] or float("nan"),
             o["bits_per_base"] or float("nan"), f"{o['n_tokens']:,}", out)
    return summary


def _cache_key(cfg: EvalConfig, ckpt: dict, par, seq_len: int, engines: list[str], targets: np.ndarray,
               rows: np.ndarray) -> dict:
    """What a cached window's scores depend on (`outputs.WindowCache`)."""
    assert cfg.shards is not None, "check_inputs refuses an eval without --shards"
    key = {"checkpoint": ckpt["model_dir"], "weights": ckpt["weights"], "shards": str(Path(cfg.shards).resolve()),
           "manifest_sha256": file_digest(Path(cfg.shards) / "manifest.json"), "split": cfg.split,
           "seq_len": seq_len, "engines": engines, "chunk_tokens": cfg.chunk_tokens, "dtype": cfg.dtype,
           "tf32": par.device.type == "cuda" and cfg.tf32}
    if cfg.context:
        key["context"], key["ablation_targets"] = cfg.context, targets.tolist()
    if cfg.strands != "forward":
        key["strands"] = cfg.strands
    if cfg.window_pick != "first":  # the first N are the same rows whatever N; a spread sample is not
        key["rows"] = rows.tolist()
    return key


def _score(cfg: EvalConfig, par, attempt: int, model_dir: str, vocab: dict, ds, lengths: np.ndarray,
           targets: np.ndarray, todo: list[int], seq_len: int, engines: list[str], cache: WindowCache | None,
           show_progress: bool | None) -> int:
    """Score the windows `todo` in rounds of one per dp replica, rank 0 caching each; returns the tokens scored."""
    from genome_lm.model import token_lut
    from genome_lm.parallel import callbacks

    assert cfg.out is not None, "check_inputs refuses an eval without --out"
    model = sharded.build_model(cfg, model_dir, par).eval()
    lut, n_known = token_lut(vocab, model_dir), len(vocab)
    passes = len(engines) + (cfg.strands == "both")  # whole-window passes: engines, reverse complement
    # forward passes per window: its pieces per whole-window pass, plus one per ablation length (less one that
    # the main pass serves); the dp replicas of a round make as many
    pieces = [sharded.n_pieces(int(w), seq_len) for w in lengths]
    forwards = [p * passes + (len(cfg.context) - (p == 1 and int(w - t) in cfg.context) if t else 0)
                for p, w, t in zip(pieces, lengths, targets)]

    def score(i: int) -> dict[str, np.ndarray]:
        tokens = ds[i]["tokens"]
        if len(tokens) and int(tokens.max()) >= n_known:  # bytes changed after prepare: not N bases
            raise GenomeLMError(f"{cfg.shards}/{cfg.split}: window {i} holds token id {int(tokens.max())}, "
                                f"outside the manifest's vocabulary (ids 0..{n_known - 1}): the shards were "
                                "changed after prepare; rebuild them with `genome-lm prepare` and --overwrite")
        arrays = {name: score_window(model, tokens, lut, n_known, seq_len, engine, cfg.chunk_tokens)
                  for name, engine in zip(("nll", "nll_alt"), engines)}
        if cfg.strands == "both":
            arrays["nll_rc"] = score_window(model, reverse_complement(tokens), lut, n_known, seq_len, cfg.engine,
                                            cfg.chunk_tokens)
        if targets[i]:
            arrays["ablation"] = ablation.score_ablation(
                model, tokens, lut, n_known, cfg.context, int(targets[i]), cfg.engine, cfg.chunk_tokens,
                main_nll=arrays["nll"] if len(tokens) <= seq_len else None)
        return arrays

    scored_tokens = 0
    with progress(int(lengths.sum()), int(lengths.sum() - lengths[todo].sum()), f"eval {Path(cfg.out).name}",
                  "tokens", disable=not par.is_main or show_progress is False, unit_scale=True) as bar:
        for r, done in enumerate(sharded.scored_rounds(par, model, todo, forwards, score)):
            for j, arrays in done:
                assert cache is not None, "scored_rounds yields windows on rank 0 only, which holds the cache"
                cache.put(j, **arrays)
                scored_tokens += int(lengths[j])
                bar.update(int(lengths[j]))
            callbacks.after_step(r + 1, par.rank, attempt)  # after each scoring round
    return scored_tokens


def _write_outputs(cfg: EvalConfig, out: Path, ds, rows: np.ndarray, seq_len: int, edges: np.ndarray,
                   cache: WindowCache | None, engines: list[str], extra: dict, annotations: list,
                   targets: np.ndarray) -> dict:
    """All output files, built under a temporary name, then the cache goes. `targets` [W]: ablation targets, 0: none."""
    from genome_lm.genome.shards import LEAKAGE_COLUMN

    assert cache is not None, "on_main runs this on rank 0, which holds the cache"
    n = len(rows)
    leakage = LEAKAGE_COLUMN in ds.column_names
    strata = [stats.REPEAT] + ([stats.LEAKAGE] if leakage else []) + [stats.annotation(a.name) for a in annotations]
    both = cfg.strands == "both"
    acc = StrataAccumulator(n, strata, edges)
    acc_rc, agree = (StrataAccumulator(n, strata, edges), stats.Agreement(n, edges)) if both else (None, None)
    par = ParityTable(edges) if cfg.parity else None
    masks = ds.remove_columns("tokens")  # rows without their tokens: where they lie, their masks
    abl: list[tuple] = []  # the ablated windows' ablation.window_parts
    with atomic_directory(out, "eval", eval_inputs(cfg), overwrite=cfg.overwrite) as tmp, \
            contextlib.ExitStack() as files:
        abl_writer = files.enter_context(RowWriter(tmp / ablation.ABLATION_FILE, ablation.SCHEMA)) \
            if cfg.context else None
        with TokensWriter(tmp / "tokens.parquet", leakage, [a.name for a in annotations], both) as writer:
            for i in range(n):
                arrays, row = cache.get(i), masks[i]
                nll = arrays["nll"]
                contexts = contexts_of(len(nll), seq_len)
                where = (row["chrom"], int(row["start"]), int(row["end"]), row["strand"])
                row_id = int(rows[i])  # the window's row in the shard split
                rec = {"nll": nll, "repeat": unpack_mask(row["repeat_mask"], len(nll)),
                       "leakage": unpack_mask(row[LEAKAGE_COLUMN], len(nll)) if leakage else None,
                       "annotations": {a.name: a.mask(*where) for a in annotations}}
                acc.add(i, rec, contexts)
                if par is not None:
                    par.add(nll, arrays["nll_alt"], contexts)
                writer.add(row_id, where, rec, False)
                if acc_rc is not None and agree is not None:  # --strands both
                    rc = stats.reverse_record(rec, arrays["nll_rc"])
                    acc_rc.add(i, rc, contexts)
                    agree.add(i, nll, rc["nll"], contexts)
                    writer.add(row_id, (*where[:3], stats.FLIP.get(where[3], where[3])), rc, True)
                if targets[i]:
                    assert abl_writer is not None, "targets are nonzero only with --context"
                    t0 = len(nll) - int(targets[i])
                    abl.append(ablation.window_parts(arrays["ablation"], [m[t0:] for m in stats.masks(rec, strata)]))
                    abl_writer.add_row(window=row_id, chrom=where[0], start=where[1], end=where[2], strand=where[3],
                                       target_start=t0, nll=list(arrays["ablation"]))  # float32 [n_L][n]
        files.close()  # context_ablation.parquet complete before the directory is renamed
        summary = summarize(acc, cfg.resamples, cfg.seed)
        summary["units"] = {"mean_nll": "nats per token", "bits_per_base": "bits per base = mean_nll / ln 2",
                            "lo/hi": "tokens of preceding context, lo inclusive, hi exclusive"}
        summary["context"] = (f"preceding context = tokens before it in its scored piece: position in the window "
                              f"modulo seq_len ({seq_len}); N bases and the first token of each piece are not scored")
        summary["strata"] = stats.describe(strata)
        for a in annotations:
            summary["strata"][stats.annotation(a.name).key].update(a.record())
            if not summary.get("annotations", {}).get(a.name, {}).get("in", {}).get("overall", {}).get("n_tokens"):
                log.warning("--annotate %s: no scored token lies in its intervals; its 'in' stratum is empty "
                            "(the intervals miss the scored windows)", a.path)
        if not leakage:
            summary["strata_absent"] = {"leakage": f"{cfg.shards}/{cfg.split} has no leakage_mask column "
                                                   "(prepare without --leakage-k, or older shards)"}
        summary["bootstrap"] = {"unit": "window", "resamples": cfg.resamples, "seed": cfg.seed, "level": 0.95,
                                "method": "percentile"}
        if acc_rc is not None and agree is not None:  # --strands both
            summary["strands"] = stats.strand_tables(acc, acc_rc, agree, cfg.resamples, cfg.seed)
        if cfg.context:
            summary["context_ablation"] = ablation.summary_section(abl, cfg.context, strata, cfg.ablation_targets, n,
                                                                   cfg.engine, cfg.resamples, cfg.seed)
        if par is not None:
            summary["parity"] = par.result(engines)
            write_json_atomic(tmp / "parity.json", summary["parity"])
        summary.update(extra)
        write_json_atomic(tmp / SUMMARY_FILE, summary)
    cache.remove()
    return summary
