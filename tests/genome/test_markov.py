"""The per-isochore Markov background of the synthetic genome (genome/synth.py)."""

import numpy as np
import pytest

from genome_lm.errors import GenomeLMError
from genome_lm.genome.params import make_params
from genome_lm.genome.synth import additive_rows, dirichlet_rows, markov_bases, synthesize, synthesize_genome


def _deterministic(next_of):
    """rows(rng) whose row c puts all mass on next_of(c)."""
    def rows(rng, order=2):
        t = np.zeros((4**order, 4))
        t[np.arange(4**order), [next_of(c) for c in range(4**order)]] = 1.0
        return t
    return rows


def test_state_holds_the_last_base_in_its_lowest_bits():
    # order 2, next base = the base two back (bits 2..3 of the row index): period 2 after the start
    seq = markov_bases(np.random.default_rng(0), np.array([40.0]), 2, 40, _deterministic(lambda c: (c >> 2) & 3))
    assert (seq[2:] == seq[:-2]).all()
    # next = last base + 1: the cycle A C G T
    seq = markov_bases(np.random.default_rng(0), np.array([40.0]), 2, 40, _deterministic(lambda c: ((c & 3) + 1) % 4))
    assert ((seq[1:].astype(int) - seq[:-1]) % 4 == 1).all()


def test_each_segment_draws_its_own_table_and_the_last_is_cut_at_n():
    tables = iter([_deterministic(lambda c: 0), _deterministic(lambda c: 3)])
    seq = markov_bases(np.random.default_rng(0), np.array([30.0, 30.0, 30.0]), 1, 45,
                       lambda rng: next(tables)(rng, order=1))
    assert len(seq) == 45 and (seq[:30] == 0).all() and (seq[30:] == 3).all()


def test_additive_rows_have_additive_log_odds():
    rows = additive_rows(np.random.default_rng(1), 3, 0.8)
    assert rows.shape == (64, 4) and np.allclose(rows.sum(axis=1), 1.0)
    lo = np.log(rows[:, 1] / rows[:, 0]).reshape(4, 4, 4)  # [base t-3, base t-2, base t-1]
    # the effect of the base at t-1 on the log-odds does not depend on the bases before it
    effect = lo[:, :, 1] - lo[:, :, 0]
    assert np.allclose(effect, effect[0, 0]) and not np.isclose(effect[0, 0], 0.0)
    assert not np.allclose(dirichlet_rows(np.random.default_rng(1), 1, 0.5), 0.25)


def test_empirical_transitions_follow_the_table():
    table = dirichlet_rows(np.random.default_rng(2), 1, 1.0)
    seq = markov_bases(np.random.default_rng(3), np.array([200_000.0]), 1, 200_000, lambda rng: table)
    counts = np.zeros((4, 4))
    np.add.at(counts, (seq[:-1], seq[1:]), 1)
    assert np.abs(counts / counts.sum(axis=1, keepdims=True) - table).max() < 0.01


def test_synth_markov_background_is_deterministic_and_more_predictable():
    kw = dict(scale=0.02, seed=0)
    a = synthesize(**kw, markov_order=4, markov_scale=1.0, repeat_fraction=0.0, iupac_every=10**9)
    assert a == synthesize(**kw, markov_order=4, markov_scale=1.0, repeat_fraction=0.0, iupac_every=10**9)
    iid = synthesize(**kw, repeat_fraction=0.0, iupac_every=10**9)

    def cond_entropy(seq: bytes) -> float:  # H(X_t | X_{t-1}) in bits, background bases only
        x = np.frombuffer(seq, dtype=np.uint8)
        codes = np.searchsorted(np.frombuffer(b"ACGT", dtype=np.uint8), x)
        ok = (x[:-1] != ord("N")) & (x[1:] != ord("N"))
        counts = np.zeros((4, 4))
        np.add.at(counts, (codes[:-1][ok].clip(0, 3), codes[1:][ok].clip(0, 3)), 1)
        p = counts / counts.sum(axis=1, keepdims=True)
        return float(-(counts * np.log2(np.where(p > 0, p, 1))).sum() / counts.sum())

    assert cond_entropy(a["chr1"]) < cond_entropy(iid["chr1"]) - 0.05
    g = synthesize_genome(0.02, 0, make_params(markov_order=2, markov_rows="dirichlet", markov_alpha=0.3))
    assert set(g.sequences) == {"chr1", "chr2", "chr22"}


@pytest.mark.parametrize("kwargs", [dict(markov_order=7), dict(markov_alpha=0.0), dict(markov_rows="other")])
def test_bad_markov_parameters_are_user_errors(kwargs):
    with pytest.raises(GenomeLMError):
        make_params(**kwargs)
