"""Context buckets and statistics on hand-computed cases; bootstrap coverage on simulated data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from genome_lm.errors import GenomeLMError
from genome_lm.eval.scoring import IGNORE_INDEX, piece_inputs
from genome_lm.eval.stats import (
    REPEAT,
    StrataAccumulator,
    assign,
    bootstrap_ci,
    bucket_edges,
    contexts_of,
    log2_edges,
    parse_edges,
    ratio,
    summarize,
    two_level_ci,
    window_stats,
)


def test_log2_edges_cover_every_context():
    assert log2_edges(0).tolist() == [0, 1]
    assert log2_edges(1000).tolist() == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert log2_edges(1023).tolist()[-1] == 1024  # window of 1024 tokens: contexts 0..1023
    assert log2_edges(1024).tolist()[-1] == 2048


def test_explicit_edges_and_errors():
    assert parse_edges("0, 16,256,4k").tolist() == [0, 16, 256, 4096]
    assert bucket_edges("log2", 5).tolist() == [0, 1, 2, 4, 8]
    for bad in ("16", "0,16,16", "0,8,4", "0,x"):
        with pytest.raises(GenomeLMError, match="--buckets"):
            parse_edges(bad)


def test_assign_is_lo_inclusive_hi_exclusive():
    edges = np.array([0, 1, 2, 4, 8])
    ctx = np.array([0, 1, 2, 3, 4, 7, 8, 100])
    assert assign(ctx, edges).tolist() == [0, 1, 2, 2, 3, 3, -1, -1]
    assert assign(np.array([4, 5, 20]), np.array([5, 10, 20])).tolist() == [-1, 0, -1]
    assert contexts_of(7, 3).tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_piece_inputs_ignore_n_and_unmapped_tokens():
    lut = np.zeros(256, dtype=np.int64)
    lut[:5] = [10, 11, 12, 13, 14]  # model ids of A C G T N
    ids, labels = piece_inputs(np.array([0, 1, 4, 7, 3], dtype=np.uint8), lut, n_known=5)
    assert ids.tolist() == [[10, 11, 14, 14, 13]]  # the unmapped id 7 is fed as N
    assert labels.tolist() == [[10, 11, IGNORE_INDEX, IGNORE_INDEX, 13]]


def test_window_stats_by_hand():
    nll = np.array([np.nan, 1.0, 2.0, 3.0, 4.0, np.nan, 6.0], dtype=np.float32)
    ctx = np.arange(7)
    repeat = np.array([0, 0, 1, 1, 0, 0, 1], dtype=bool)
    edges = np.array([0, 1, 2, 4])  # buckets [0,1) [1,2) [2,4); contexts 4..6 fall outside
    sums, counts, ctx_sums = window_stats(nll, ctx, repeat, edges)
    # rows: unmasked, masked; columns: 3 buckets + all
    assert counts.tolist() == [[0, 1, 0, 2], [0, 0, 2, 3]]
    assert sums.tolist() == [[0, 1.0, 0, 5.0], [0, 0, 5.0, 11.0]]
    assert ctx_sums.tolist() == [[0, 1, 0, 5], [0, 0, 5, 11]]


def test_summarize_by_hand():
    acc = StrataAccumulator(2, [REPEAT], np.array([0, 1, 2, 4]))
    acc.add(0, {"nll": np.array([np.nan, 1, 1, 1], np.float32), "repeat": np.zeros(4, bool)}, np.arange(4))
    acc.add(1, {"nll": np.array([np.nan, 3, 3, 3], np.float32), "repeat": np.array([0, 1, 1, 1], bool)}, np.arange(4))
    s = summarize(acc, resamples=500)
    assert s["overall"]["n_tokens"] == 6 and s["overall"]["mean_nll"] == pytest.approx(2.0)
    assert s["overall"]["bits_per_base"] == pytest.approx(2.0 / math.log(2))
    b0, b1, b2 = s["buckets"]
    assert (b0["lo"], b0["hi"], b0["n_tokens"], b0["mean_nll"], b0["ci_low"]) == (0, 1, 0, None, None)
    assert (b1["lo"], b1["hi"], b1["n_tokens"], b1["mean_nll"]) == (1, 2, 2, pytest.approx(2.0))
    assert b2["context_mean"] == pytest.approx(2.5) and b2["n_windows"] == 2
    # two windows with means 1 and 3: resamples give 1, 2 or 3
    assert b1["ci_low"] == pytest.approx(1.0) and b1["ci_high"] == pytest.approx(3.0)
    assert s["repeat"]["masked"]["overall"]["mean_nll"] == pytest.approx(3.0)
    assert s["repeat"]["masked"]["overall"]["n_tokens"] == 3
    assert s["repeat"]["unmasked"]["overall"]["mean_nll"] == pytest.approx(1.0)  # token 0 of w2 is not scored


def test_bootstrap_gives_no_ci_to_what_one_window_defines():
    """One window, or a column that only one window reaches, resamples to a single value: no CI
    (NaN), not a zero-width one. Two windows give the spread between them."""
    stat = lambda s, n: ratio(s, n)  # noqa: E731
    low, high = bootstrap_ci(stat, {"s": np.array([[6.0]]), "n": np.array([[3.0]])})
    assert np.isnan(low).all() and np.isnan(high).all()
    s, n = np.array([[6.0, 5.0], [2.0, 0.0], [4.0, 0.0]]), np.array([[3.0, 5.0], [2.0, 0.0], [2.0, 0.0]])
    low, high = bootstrap_ci(stat, {"s": s, "n": n}, resamples=500)
    assert (low[0], high[0]) == (pytest.approx(1.0), pytest.approx(2.0))  # window means 2, 1, 2
    assert np.isnan(low[1]) and np.isnan(high[1])  # only window 0 has tokens in column 1


def test_bootstrap_ci_covers_true_mean_at_nominal_rate():
    """Windows with their own random offset (correlated tokens): the window bootstrap must cover
    the true mean about 95% of the time; a token-level CI would be far too narrow."""
    rng = np.random.default_rng(1)
    true, reps, W, T = 2.0, 300, 30, 200
    covered, token_covered = 0, 0
    for _ in range(reps):
        offsets = rng.normal(0, 0.3, W)
        sizes = rng.integers(T // 2, T, W)
        tokens = [true + o + rng.normal(0, 1.0, n) for o, n in zip(offsets, sizes)]
        s = np.array([[t.sum()] for t in tokens])
        n = sizes[:, None].astype(float)
        low, high = bootstrap_ci(lambda s, n: ratio(s, n), {"s": s, "n": n}, resamples=400,
                                 seed=int(rng.integers(1 << 30)))
        covered += low[0] <= true <= high[0]
        all_tok = np.concatenate(tokens)
        half = 1.96 * all_tok.std() / math.sqrt(len(all_tok))
        token_covered += abs(all_tok.mean() - true) <= half
    assert 0.88 <= covered / reps <= 0.99
    assert token_covered / reps < 0.6


def test_bootstrap_is_deterministic():
    s, n = np.arange(10.0)[:, None], np.ones((10, 1))
    a = bootstrap_ci(lambda s, n: ratio(s, n), {"s": s, "n": n}, seed=3)
    b = bootstrap_ci(lambda s, n: ratio(s, n), {"s": s, "n": n}, seed=3)
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def test_two_level_ci_covers_seed_spread_that_the_window_bootstrap_misses():
    """Replicates (training seeds) with their own offset on shared windows: the bootstrap over seeds,
    then windows, covers the mean over seeds about 95% of the time; the window bootstrap of the pooled
    replicates does not, as it cannot see the seeds' spread."""
    rng = np.random.default_rng(1)
    true, reps, R, W, T = 2.0, 200, 6, 20, 100
    covered = window_covered = 0
    for _ in range(reps):
        seed_eff, win_eff = rng.normal(0, 0.2, R), rng.normal(0, 0.2, W)
        s = T * (true + seed_eff[:, None] + win_eff[None, :] + rng.normal(0, 0.1, (R, W)))
        n = np.full((R, W), float(T))
        low, high = two_level_ci(lambda s, n: ratio(s, n), {"s": s[..., None], "n": n[..., None]}, resamples=400,
                                 seed=int(rng.integers(1 << 30)))
        covered += low[0] <= true <= high[0]
        low, high = bootstrap_ci(lambda s, n: ratio(s, n), {"s": s.sum(0)[:, None], "n": n.sum(0)[:, None]},
                                 resamples=400, seed=int(rng.integers(1 << 30)))
        window_covered += low[0] <= true <= high[0]
    assert 0.85 <= covered / reps <= 0.99
    assert window_covered / reps < 0.75


def test_two_level_ci_of_one_replicate_is_the_window_bootstrap():
    s, n = np.arange(1.0, 11.0)[:, None] * 3, np.full((10, 1), 3.0)
    stat = lambda s, n: ratio(s, n)  # noqa: E731
    one = two_level_ci(stat, {"s": s[None], "n": n[None]}, resamples=300, seed=5)
    ref = bootstrap_ci(stat, {"s": s, "n": n}, resamples=300, seed=5)
    assert one[0].tolist() == ref[0].tolist() and one[1].tolist() == ref[1].tolist()
    low, high = two_level_ci(stat, {"s": s[None, :1], "n": n[None, :1]})
    assert np.isnan(low).all() and np.isnan(high).all()  # one window: nothing to resample
