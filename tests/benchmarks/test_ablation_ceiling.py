"""`benchmarks/ablation_ceiling.py`'s delta-rule readers: each head is the delta rule it claims to be
(an exponential moving average per key when the keys are one-hot), causal, and a slow head keeps
improving with more context on a pure chain where a fast one does not."""

import numpy as np
import pytest

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def ceiling():
    return load_benchmark("ablation_ceiling")


def test_one_hot_keys_make_each_head_a_moving_average_per_preceding_base(ceiling):
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, 4, (2, 300))
    betas, t0, lengths = [0.3, 0.02], 260, [50, 200]
    out = ceiling.delta_outputs(seqs, "dirichlet", 1, betas, t0, lengths)  # [2 betas, 2 L, 2 windows, 40, 4]
    for b, beta in enumerate(betas):
        for j, L in enumerate(lengths):
            for n, seq in enumerate(seqs):
                for t in range(t0, 300):
                    ema = np.zeros(4)
                    for i in range(max(1, t0 - L), t):  # writes at i whose preceding base matches t's
                        if seq[i - 1] == seq[t - 1]:
                            ema = (1 - beta) * ema + beta * np.eye(4)[seq[i]]
                    np.testing.assert_allclose(out[b, j, n, t - t0], ema / np.linalg.norm(ema), atol=1e-12)


def test_outputs_are_causal(ceiling):
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 4, (1, 400))
    other = seq.copy()
    other[0, 350:] = (other[0, 350:] + 1) % 4  # change every base from 350 on
    a, b = (ceiling.delta_outputs(s, "additive", 6, [0.1], 300, [100]) for s in (seq, other))
    np.testing.assert_array_equal(a[..., :51, :], b[..., :51, :])  # targets up to 350 see bases < 350 only
    assert not np.allclose(a[..., 51:, :], b[..., 51:, :])


def test_a_slow_head_gains_from_more_context_and_a_fast_one_does_not(ceiling):
    test, _ = ceiling.chains("additive", 6, 0.4, 4, 3072, seed=0)
    fit, _ = ceiling.chains("additive", 6, 0.4, 4, 3072, seed=1)
    rows = ceiling.delta_rows(fit, test, "additive", 6, [(0.3,), (0.01,)], 2560, [256, 1024, 2560])
    fast, slow = (r["by_length"] for r in rows)
    assert abs(fast["256"] - fast["2560"]) < 0.002
    assert slow["256"] - slow["1024"] > 0.01 and slow["1024"] - slow["2560"] > 0.005
    assert rows[1]["gain_ci95"][0] > 0  # from 1k to the longest L, clear of zero over windows
