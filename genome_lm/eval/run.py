"""`genome-lm eval`: score the windows of a split, then summarise loss by preceding context.

    cfg = EvalConfig(checkpoint="runs/demo/checkpoints/last", shards="shards/demo", out="evals/demo")
    summary = evaluate(cfg)

Steps, top to bottom:
  1. check the inputs (checkpoint, shards, split, engine) and that --out is free;
  2. score every window not yet in the per-window cache (`cache.py`), no gradients, one
     window at a time (memory bounded by one window / piece), with a progress bar;
  3. build the outputs under a temporary name (`utils.atomic_directory`): tokens.parquet,
     summary.json (and parity.json with --parity), then rename into place and drop the cache.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from genome_lm.errors import GenomeLMError
from genome_lm.eval import parity as parity_mod
from genome_lm.eval.buckets import bucket_edges, contexts_of
from genome_lm.eval.cache import WindowCache
from genome_lm.eval.config import EvalConfig
from genome_lm.eval.outputs import SUMMARY_FILE, TokensWriter
from genome_lm.eval.scoring import score_window, streaming_scorer
from genome_lm.eval.stats import summarize, window_stats
from genome_lm.genome.tokenizer import unpack_mask
from genome_lm.utils import atomic_directory, sha256_file, write_json_atomic

log = logging.getLogger(__name__)
HASH_WEIGHTS_UP_TO = 2 << 30  # hash checkpoint weights up to this size; larger ones by size/mtime


def checkpoint_record(checkpoint: str) -> dict:
    """Where the model came from: resolved model dir, config hash, weights hash (or file stats)."""
    from genome_lm.train.checkpoint import resolve_model_dir

    model_dir = resolve_model_dir(checkpoint).resolve()
    weights = sorted(model_dir.glob("*.safetensors"))
    stats = [{"file": p.name, "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p in weights]
    record = {"path": str(checkpoint), "model_dir": str(model_dir),
              "config_sha256": sha256_file(model_dir / "config.json"), "weights": stats}
    if sum(s["size"] for s in stats) <= HASH_WEIGHTS_UP_TO:
        h = hashlib.sha256()
        for p in weights:
            h.update(sha256_file(p).encode())
        record["weights_sha256"] = h.hexdigest()
    return record


def _check(cfg: EvalConfig) -> tuple[Path, dict, object]:
    from genome_lm.genome.shards import load_manifest, load_shards

    out = Path(cfg.out)
    if out.exists() and not cfg.overwrite:
        raise GenomeLMError(f"--out {out} already exists; pass --overwrite to replace it or choose another --out")
    if cfg.engine == "streaming" or cfg.parity:
        streaming_scorer()
    if not Path(cfg.checkpoint).exists():
        raise GenomeLMError(f"--checkpoint {cfg.checkpoint} does not exist; point it to a run's checkpoints/last "
                            "or a model directory")
    manifest = load_manifest(cfg.shards)
    ds = load_shards(cfg.shards, cfg.split)
    if len(ds) == 0:
        raise GenomeLMError(f"{cfg.shards}/{cfg.split} has no windows to score")
    return out, manifest, ds


def _load_model(cfg: EvalConfig, model_dir: str, manifest: dict):
    from genome_lm.model import apply_long_context, build, token_map

    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build(model_dir, dtype=cfg.dtype, device=device)
    apply_long_context(model, loss_chunk_tokens=cfg.loss_chunk_tokens)
    model.eval()
    mapped = np.asarray(token_map(manifest["vocab"], model_dir))
    lut = np.zeros(256, dtype=np.int64)
    lut[: len(mapped)] = mapped
    return model, lut, len(mapped)


def evaluate(cfg: EvalConfig, show_progress: bool | None = None) -> dict:
    """Run the eval described by `cfg`; return the summary (also written to OUT/summary.json)."""
    t0 = time.perf_counter()
    out, manifest, ds = _check(cfg)
    ckpt = checkpoint_record(cfg.checkpoint)
    n = len(ds) if cfg.max_windows is None else min(cfg.max_windows, len(ds))
    head = ds.select(range(n))
    meta = {c: np.asarray(head[c]) for c in ("chrom", "start", "end", "strand")}
    lengths = (meta["end"] - meta["start"]).astype(np.int64)
    seq_len = int(cfg.seq_len or lengths.max())
    edges = bucket_edges(cfg.buckets, max_context=int(min(seq_len, lengths.max())) - 1)
    engines = [cfg.engine] + ([parity_mod.other_engine(cfg.engine)] if cfg.parity else [])
    key = {"checkpoint": ckpt["model_dir"], "weights": ckpt["weights"], "shards": str(Path(cfg.shards).resolve()),
           "manifest_sha256": sha256_file(Path(cfg.shards) / "manifest.json"), "split": cfg.split,
           "seq_len": seq_len, "engines": engines, "chunk_tokens": cfg.chunk_tokens, "dtype": cfg.dtype}
    cache = WindowCache(out, key)

    todo = [i for i in range(n) if not cache.has(i)]
    log.info("eval %s on %s/%s: %d windows (%s tokens), seq_len %d, engine %s%s; %d already cached",
             ckpt["model_dir"], cfg.shards, cfg.split, n, f"{int(lengths.sum()):,}", seq_len, cfg.engine,
             " + parity" if cfg.parity else "", n - len(todo))
    scored_tokens, t_score = 0, time.perf_counter()
    if todo:
        model, lut, n_known = _load_model(cfg, ckpt["model_dir"], manifest)
        bar = tqdm(total=int(lengths.sum()), initial=int(lengths.sum() - lengths[todo].sum()), unit="tok",
                   unit_scale=True, desc=f"eval {out.name}", disable=None if show_progress is None else not show_progress)
        try:
            for i in todo:
                tokens = ds[i]["tokens"]
                arrays = {name: score_window(model, tokens, lut, n_known, seq_len, engine, cfg.chunk_tokens)
                          for name, engine in zip(("nll", "nll_alt"), engines)}
                cache.put(i, **arrays)
                scored_tokens += len(tokens)
                bar.update(len(tokens))
        finally:
            bar.close()
    t_score = time.perf_counter() - t_score

    extra = {
        "checkpoint": ckpt,
        "shards": {"path": str(cfg.shards), "split": cfg.split, "manifest_sha256": key["manifest_sha256"],
                   "n_windows": n, "n_windows_in_split": len(ds)},
        "config": {**cfg.model_dump(), "seq_len": seq_len, "seq_len_requested": cfg.seq_len,
                   "bucket_edges": edges.tolist(), "engines": engines},
        "timing": {"elapsed_s": time.perf_counter() - t0, "scored_tokens": scored_tokens,
                   "tokens_per_s": scored_tokens / t_score if scored_tokens else None},
    }
    summary = _write_outputs(cfg, out, ds, meta, n, seq_len, edges, cache, engines, extra)
    cache.remove()
    o = summary["overall"]
    log.info("eval done: mean NLL %.4f nats/token (%.4f bits/base) over %s tokens -> %s", o["mean_nll"] or float("nan"),
             o["bits_per_base"] or float("nan"), f"{o['n_tokens']:,}", out)
    return summary


def _write_outputs(cfg: EvalConfig, out: Path, ds, meta: dict, n: int, seq_len: int, edges: np.ndarray,
                   cache: WindowCache, engines: list[str], extra: dict) -> dict:
    """tokens.parquet + summary.json (+ parity.json), built under a temporary name."""
    K = len(edges) - 1
    sums, counts = np.zeros((n, 2, K + 1)), np.zeros((n, 2, K + 1), dtype=np.int64)
    ctx_sums = np.zeros((2, K + 1))
    par = parity_mod.ParityTable(edges) if cfg.parity else None
    masks = ds.select_columns(["repeat_mask"])  # rows without their tokens
    with atomic_directory(out, overwrite=cfg.overwrite) as tmp:
        with TokensWriter(tmp / "tokens.parquet") as writer:
            for i in range(n):
                arrays = cache.get(i)
                nll = arrays["nll"]
                packed = masks[i]["repeat_mask"]
                repeat = unpack_mask(packed, len(nll))
                contexts = contexts_of(len(nll), seq_len)
                s, c, x = window_stats(nll, contexts, repeat, edges)
                sums[i], counts[i], ctx_sums = s, c, ctx_sums + x
                if par is not None:
                    par.add(nll, arrays["nll_alt"], contexts)
                writer.add(i, str(meta["chrom"][i]), int(meta["start"][i]), int(meta["end"][i]), str(meta["strand"][i]),
                           nll, packed)
        summary = summarize(sums, counts, ctx_sums, edges, cfg.resamples, cfg.seed)
        summary["units"] = {"mean_nll": "nats per token", "bits_per_base": "bits per base = mean_nll / ln 2",
                            "lo/hi": "tokens of preceding context, lo inclusive, hi exclusive"}
        summary["context"] = (f"preceding context = tokens before it in its scored piece: position in the window "
                              f"modulo seq_len ({seq_len}); N bases and the first token of each piece are not scored")
        summary["bootstrap"] = {"unit": "window", "resamples": cfg.resamples, "seed": cfg.seed, "level": 0.95,
                                "method": "percentile"}
        if par is not None:
            summary["parity"] = par.result(engines)
            write_json_atomic(tmp / "parity.json", summary["parity"])
        summary.update(extra)
        write_json_atomic(tmp / SUMMARY_FILE, summary)
    return summary
