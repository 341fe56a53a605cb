"""Variant scoring from a shared prefix equals scoring each whole sequence from scratch.

`score_continuations` runs the context once, snapshots the KDA states and the DSA cache length, and
scores every allele from the snapshot; here each allele's log-probs are compared with
`score_streaming` over context + allele (+ the bases after it), which equals the parallel forward
(tests/model/test_streaming.py), float32, tolerance PARITY: SNVs, a deletion and an insertion, on
both strands, a variant nearer the contig start than the context, and alleles whose sequence lengths
fall in other DSA top-k rows (`total_len // kpool`)."""

import numpy as np
import pytest
import torch

from genome_lm.model import apply_long_context
from genome_lm.model.streaming import score_streaming
from genome_lm.score.engine import score_continuations
from genome_lm.score.variants import windows
from genome_lm.score.vcf import Variant
from tests.helpers import assert_close, tiny_model

PARITY = 1e-4
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return apply_long_context(tiny_model(3, initializer_range=0.1), dsa_block_queries=64).eval()


def from_scratch(model, prefix, cont):
    nll = score_streaming(model, torch.as_tensor(np.r_[prefix, cont], dtype=torch.long)[None], chunk_tokens=4096)
    lp = -nll[len(prefix):].numpy()
    if not len(prefix):
        lp[0] = np.nan
    return lp


@pytest.mark.parametrize("strand", ["+", "-"])
def test_each_allele_equals_its_whole_sequence_scored_from_scratch(model, strand):
    tokens = np.random.default_rng(5).integers(0, 4, 600).astype(np.uint8)
    seq = "".join("ACGT"[t] for t in tokens)
    at = 300  # 0-based
    locus = [Variant("1", at + 1, "s", seq[at], alt, None) for alt in "ACGT" if alt != seq[at]]
    locus += [Variant("1", at + 1, "d", seq[at:at + 4], seq[at], None),  # a deletion: 3 fewer tokens
              Variant("1", at + 1, "i", seq[at], seq[at] + "GATTACA", None)]  # an insertion: another top-k row
    for L, after in ((160, 5), (1000, 0)):  # 1000: more than the contig holds on either side
        parts = [windows(v, tokens, L, strand, after) for v in locus]
        assert all(len(p[0]) == len(parts[0][0]) for p in parts) or strand == "-"
        for v, (prefix, ref, alt) in zip(locus, parts):
            got = score_continuations(model, prefix, [ref, alt], chunk_tokens=64)
            for name, cont, lp in (("ref", ref, got[0]), ("alt", alt, got[1])):
                assert_close(f"{v.id} {name} {strand} L={L}", lp, from_scratch(model, prefix, cont), PARITY,
                             floor=None)
    snvs = parts[:3]  # one locus: the SNVs share a prefix pass on either strand
    got = score_continuations(model, snvs[0][0], [c for p in snvs for c in p[1:]], chunk_tokens=64)
    for k, (prefix, ref, alt) in enumerate(snvs):
        assert_close("shared locus", got[2 * k + 1], from_scratch(model, prefix, alt), PARITY, floor=None)


def test_windows_read_the_minus_strand_as_the_reverse_complement():
    tokens = np.array([0, 0, 1, 2, 3, 3, 1], dtype=np.uint8)  # AACGTTC
    v = Variant("1", 4, "x", "G", "A")  # G at 0-based 3
    prefix, ref, alt = windows(v, tokens, 2, "+", 2)
    assert prefix.tolist() == [0, 1] and ref.tolist() == [2, 3, 3] and alt.tolist() == [0, 3, 3]
    prefix, ref, alt = windows(v, tokens, 10, "-", 2)
    assert prefix.tolist() == [2, 0, 0] and ref.tolist() == [1, 2, 3] and alt.tolist() == [3, 2, 3]  # GAA | C GT
