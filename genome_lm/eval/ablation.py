"""Context ablation (`eval --context 1k,2k,4k [--ablation-targets n]`, docs/eval.md): a window's last n
tokens [t0, end) scored given exactly L preceding tokens (one sequence [t0 - L, end) per L), so
differences between lengths are paired; windows with t0 < max(L) take no part. The forward strand only.
`context_ablation.parquet`: a row per window, its targets' nll list<list<float32>> [n_L][n]."""

from __future__ import annotations

from itertools import zip_longest
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from genome_lm.errors import GenomeLMError
from genome_lm.eval.outputs import iter_windows, table_rows
from genome_lm.eval.stats import LN2, bootstrap_ci, jfloat, masks, merged_strata, paired_stat, place, ratio, strata_of
from genome_lm.settings import STREAMING_CHUNK_TOKENS

ABLATION_FILE = "context_ablation.parquet"
TARGET_FRACTION = 8  # default targets: the last length // 8 tokens of each window
SCHEMA = pa.schema([("window", pa.int64()), ("chrom", pa.string()), ("start", pa.int64()), ("end", pa.int64()),
                    ("strand", pa.string()), ("target_start", pa.int64()), ("nll", pa.list_(pa.list_(pa.float32())))])


def plan(window_lengths: np.ndarray, lengths: list[int], targets: int | None, seq_len: int | None,
         cp: int = 1) -> np.ndarray:
    """Targets n int64 [W] of each window, 0 for a window that does not take part; one-line errors."""
    L = sorted(lengths)
    if L[0] < 1:
        raise GenomeLMError(f"--context {L[0]}: every length must be >= 1 (tokens of preceding context)")
    n = np.full_like(window_lengths, int(targets)) if targets else np.maximum(1, window_lengths // TARGET_FRACTION)
    if targets and int(targets) >= int(window_lengths.max()):
        raise GenomeLMError(f"--ablation-targets {targets}: must be below the window length "
                            f"({int(window_lengths.max()):,} tokens); the targets need preceding context")
    t0 = window_lengths - n
    if L[-1] > int(t0.max()):
        raise GenomeLMError(
            f"--context {L[-1]:,}: too long for these windows; the targets of a {int(window_lengths.max()):,}-token "
            f"window start at token {int(t0.max()):,}, so L can be at most {int(t0.max()):,} (lower --context"
            f"{', or --ablation-targets' if targets else ', or give a smaller --ablation-targets'})")
    if seq_len is not None and L[-1] + int(n.max()) > seq_len:
        raise GenomeLMError(f"--context {L[-1]:,}: L + targets ({L[-1] + int(n.max()):,} tokens) is more than "
                            f"--seq-len {seq_len:,} (the longest sequence one forward takes); raise --seq-len or "
                            "lower --context / --ablation-targets")
    if L[0] + int(n.min()) < cp:
        raise GenomeLMError(f"--context {L[0]}: a sequence of L + targets tokens must have >= --cp {cp} tokens")
    return np.where(t0 >= L[-1], n, 0)


def score_ablation(model, tokens: np.ndarray, lut: np.ndarray, n_known: int, lengths: list[int], n: int,
                   engine: str = "parallel", chunk_tokens: int = STREAMING_CHUNK_TOKENS,
                   main_nll: np.ndarray | None = None) -> np.ndarray:
    """NLL float32 [n_L, n] of the last n tokens of a window (uint8 [T]) given exactly L preceding tokens,
    for each L of `lengths`; `main_nll` [T], the window scored as one piece, serves an L of T - n."""
    from genome_lm.eval.scoring import IGNORE_INDEX, piece_inputs, score_piece

    t0 = len(tokens) - n
    out = np.empty((len(lengths), n), dtype=np.float32)
    for j, L in enumerate(lengths):
        if L == t0 and main_nll is not None:
            out[j] = main_nll[t0:]
            continue
        ids, labels = piece_inputs(tokens[t0 - L:], lut, n_known)  # [1, L + n]
        labels[:, :L] = IGNORE_INDEX  # only the targets are scored
        if engine == "streaming":
            out[j] = _stream_targets(model, ids, labels, L, chunk_tokens)
        else:
            out[j] = score_piece(model, ids, labels, engine, chunk_tokens)[L:]
    return out


def _stream_targets(model, ids, labels, L: int, chunk_tokens: int) -> np.ndarray:
    """NLL float32 [n] by the streaming engine on ids [1, L + n]: the prefix through `hidden_step` only,
    the targets through `step` (the prefix's last hidden state scores the first target)."""
    import torch

    from genome_lm.eval.scoring import IGNORE_INDEX
    from genome_lm.model.streaming import StreamingScorer

    T = ids.shape[1]
    ids = ids.to(model.lm_head.weight.device)
    scorer = StreamingScorer(model, total_len=T)
    with torch.no_grad():
        for c0 in range(0, L, chunk_tokens):
            hidden = scorer.hidden_step(ids[:, c0:min(c0 + chunk_tokens, L)])
        scorer.last_hidden = hidden[:, -1:].clone()
        nll = torch.cat([scorer.step(ids[:, t:min(t + chunk_tokens, T)])[0] for t in range(L, T, chunk_tokens)])
    return np.where(labels[0, L:].numpy() != IGNORE_INDEX, nll.float().cpu().numpy(), np.nan).astype(np.float32)


def iter_ablation(eval_dir: str | Path) -> Iterator[dict]:
    """Rows of `context_ablation.parquet`, nll float32 [n_L, n]."""
    for table, row in table_rows(Path(eval_dir) / ABLATION_FILE):
        rec = {c: table.column(c)[row].as_py() for c in SCHEMA.names[:-1]}
        rec["nll"] = np.asarray(table.column("nll")[row].as_py(), dtype=np.float32)
        yield rec


def table(sums: np.ndarray, counts: np.ndarray, lengths: list[int], resamples: int, seed: int) -> dict:
    """{"by_length", "paired_differences" (consecutive L), "span" (shortest to longest L; None with one
    L)} from per-window sums [W, n_L] and counts [W] of the same targets at every L."""
    n = np.broadcast_to(counts[:, None], sums.shape).astype(np.float64)

    def stat(s, n):  # [r, n_L] each -> mean [n_L], then the consecutive steps and the span [n_L]
        d = np.concatenate([s[:, 1:] - s[:, :-1], s[:, -1:] - s[:, :1]], axis=1)
        return np.concatenate([ratio(s, n), ratio(d, n[:, :1].repeat(d.shape[1], axis=1))], axis=1)

    k, tokens, windows = len(lengths), int(counts.sum()), int((counts > 0).sum())
    est = stat(sums.sum(axis=0)[None], n.sum(axis=0)[None])[0]
    mean, delta = est[:k], est[k:]
    low, high = bootstrap_ci(stat, {"s": sums, "n": n}, resamples, seed)
    by_length = [{"L": int(L), "mean_nll": jfloat(mean[j]), "bits_per_base": jfloat(mean[j] / LN2),
                  "ci_low": jfloat(low[j]), "ci_high": jfloat(high[j]), "tokens": tokens, "n_windows": windows}
                 for j, L in enumerate(lengths)]

    def diff(j: int, a: int, b: int) -> dict:
        return {"from": int(a), "to": int(b), "mean_delta": jfloat(delta[j]), "mean_delta_bits": jfloat(delta[j] / LN2),
                "ci_low": jfloat(low[k + j]), "ci_high": jfloat(high[k + j]), "tokens": tokens}

    diffs = [diff(j, lengths[j], lengths[j + 1]) for j in range(k - 1)]
    span = diff(k - 1, lengths[0], lengths[-1]) if k > 1 else None
    return {"by_length": by_length, "paired_differences": diffs, "span": span}


def window_parts(nll: np.ndarray, masks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """One window's NLL sums float64 [1 + 2 S, n_L] and counts [1 + 2 S] over the targets of `nll` [n_L, n]
    scored at every L: all of them, then each stratum's classes (`masks` bool [n] per stratum); and its n."""
    scored = ~np.isnan(nll).any(axis=0)
    keep = [scored] + [scored & (m == c) for m in masks for c in (False, True)]
    sums = np.stack([nll[:, k].astype(np.float64).sum(axis=1) for k in keep])
    return sums, np.array([int(k.sum()) for k in keep]), nll.shape[1]


def summary_section(parts: list[tuple[np.ndarray, np.ndarray, int]], lengths: list[int], strata: list,
                    targets: int | None, n_windows: int, engine: str, resamples: int, seed: int) -> dict:
    """summary.json's `context_ablation` from the ablated windows' `window_parts`."""
    sums, counts = np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts])  # [W, 1 + 2 S, n_L], [W, 1 + 2 S]

    def part(i: int) -> dict:
        return table(sums[:, i], counts[:, i], lengths, resamples, seed)

    out = {"targets_per_window": parts[0][2] if len({p[2] for p in parts}) == 1 else None,
           "targets": f"the last {targets} tokens of each window" if targets else
           f"the last length // {TARGET_FRACTION} tokens of each window",
           "lengths": list(lengths), "n_windows": len(parts), "windows_left_out": n_windows - len(parts),
           "target_tokens": int(counts[:, 0].sum()), **part(0),
           "definition": "target t (t0 <= t < end) scored given tokens [t0 - L, t) of its window; mean_delta = "
                         "mean_nll(to) - mean_nll(from) over the same tokens (negative: more context helps); "
                         "CIs: bootstrap over windows",
           "engine": engine}
    return place(out, strata, lambda i, c: part(1 + 2 * i + c))


def ablation_sums(a: Path, b: Path, lengths_a: list[int], lengths_b: list[int]):
    """(common lengths, strata, sa, sb [W, 1 + 2 S, n_C], counts [W, 1 + 2 S]) over the targets both scored
    at every common L (all, then each stratum's classes), or why the evals cannot be paired."""
    if not (a / ABLATION_FILE).is_file() or not (b / ABLATION_FILE).is_file():
        return "both evals need --context (context_ablation.parquet)"
    common = sorted(set(lengths_a) & set(lengths_b))
    if not common:
        return f"no --context length in both evals ({lengths_a} vs {lengths_b})"
    ja, jb = [lengths_a.index(L) for L in common], [lengths_b.index(L) for L in common]
    windows = zip(iter_windows(a, "forward"), iter_windows(b, "forward"))  # the ablated rows, and more
    rows, strata = [], None
    for ra, rb in zip_longest(iter_ablation(a), iter_ablation(b)):
        if ra is None or rb is None or (ra["window"], ra["target_start"]) != (rb["window"], rb["target_start"]):
            what = lambda r: "none" if r is None else f"window {r['window']} from token {r['target_start']}"  # noqa: E731
            raise GenomeLMError(f"{a} and {b} ablated different targets ({what(ra)} vs {what(rb)}); evaluate both "
                                "with the same --ablation-targets, windows and largest --context")
        found = next((w for w in windows if w[0]["window"] == ra["window"]), None)
        if found is None:
            raise GenomeLMError(f"{a}: window {ra['window']} of {ABLATION_FILE} is not in tokens.parquet; "
                                "evaluate again into an empty --out")
        rec = merged_strata(*found)
        strata = strata_of(rec) if strata is None else strata
        xa, xb = ra["nll"][ja], rb["nll"][jb]  # [n_C, n]
        t0, lost = ra["target_start"], np.isnan(xa).any(axis=0) | np.isnan(xb).any(axis=0)
        classes = [m[t0:t0 + xa.shape[1]] for m in masks(rec, strata)]
        parts = [window_parts(np.where(lost, np.nan, x), classes) for x in (xa, xb)]  # the targets both scored
        rows.append((parts[0][0], parts[1][0], parts[0][1]))
    if not rows:
        return "no window in both evals' context_ablation.parquet"
    return common, strata, *(np.stack(x) for x in zip(*rows))


def ablation_tables(sums, resamples: int, seed: int) -> dict:
    """compare.json's `context_ablation` from `ablation_sums`' tuple (or replicates' pooled sums)."""
    common, strata, sa, sb, counts = sums

    def part(i: int) -> dict:
        return _paired_ablation(sa[:, i], sb[:, i], counts[:, i], common, resamples, seed)

    out = {"lengths": common, "n_windows": len(counts), "target_tokens": int(counts[:, 0].sum()), **part(0),
           "definition": "a, b: each eval's ablation over the targets both scored at every L; diff = mean_nll_B - "
                         "mean_nll_A at each L; gain_difference = B's mean_delta - A's from L_i to L_i+1 "
                         "(negative: B gains more from the added context); CIs: paired bootstrap over windows"}
    return place(out, strata, lambda i, c: part(1 + 2 * i + c))


def _paired_ablation(sa: np.ndarray, sb: np.ndarray, counts: np.ndarray, common: list[int], resamples: int,
                     seed: int) -> dict:
    """{"a", "b", "difference", "gain_difference"} of per-window sums sa, sb [W, n_C] and counts [W]."""
    nn = np.broadcast_to(counts[:, None], sa.shape).astype(np.float64)
    k = len(common)

    def stat(a, b, n):  # [r, n_C] each -> diff [n_C], rel % [n_C], gain difference [n_C - 1]
        gain = ratio((b[:, 1:] - b[:, :-1]) - (a[:, 1:] - a[:, :-1]), n[:, 1:])
        return np.concatenate([paired_stat(a, b, n), gain], axis=1)

    est = stat(sa.sum(0)[None], sb.sum(0)[None], nn.sum(0)[None])[0]
    low, high = bootstrap_ci(stat, {"a": sa, "b": sb, "n": nn}, resamples, seed)
    ta, tb = table(sa, counts, common, resamples, seed), table(sb, counts, common, resamples, seed)
    tokens = int(counts.sum())
    difference = [{"L": L, "mean_nll_a": ta["by_length"][j]["mean_nll"], "mean_nll_b": tb["by_length"][j]["mean_nll"],
                   "diff": jfloat(est[j]), "diff_ci_low": jfloat(low[j]), "diff_ci_high": jfloat(high[j]),
                   "diff_bits_per_base": jfloat(est[j] / LN2), "rel_change_pct": jfloat(est[k + j]),
                   "rel_ci_low": jfloat(low[k + j]), "rel_ci_high": jfloat(high[k + j]), "tokens": tokens}
                  for j, L in enumerate(common)]
    gain = [{"from": common[j], "to": common[j + 1], "delta_a": ta["paired_differences"][j]["mean_delta"],
             "delta_b": tb["paired_differences"][j]["mean_delta"], "diff": jfloat(est[2 * k + j]),
             "diff_bits": jfloat(est[2 * k + j] / LN2),
             "ci_low": jfloat(low[2 * k + j]), "ci_high": jfloat(high[2 * k + j]), "tokens": tokens}
            for j in range(k - 1)]
    return {"a": ta, "b": tb, "difference": difference, "gain_difference": gain}
