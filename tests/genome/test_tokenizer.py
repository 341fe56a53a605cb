import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from genome_lm.genome.tokenizer import (
    VOCAB,
    decode,
    encode,
    reverse_complement,
    unpack_mask,
)


@given(st.text(alphabet="ACGTN", max_size=300))
def test_decode_encode_round_trip(s):
    tokens = encode(s)
    assert tokens.dtype == np.uint8
    assert decode(tokens) == s
    assert np.array_equal(encode(decode(tokens)), tokens)


def test_soft_mask_and_iupac_map_to_tokens():
    assert decode(encode("acgtn")) == "ACGTN"
    assert decode(encode("RYKMSWBDHVrykmswbdhv")) == "N" * 20
    assert list(encode("ACGTN")) == [VOCAB[b] for b in "ACGTN"]


def test_invalid_character_is_named():
    with pytest.raises(ValueError, match=r"invalid base 'X' at offset 3"):
        encode("ACGX")
    with pytest.raises(ValueError):
        decode(np.array([0, 9]))


@given(st.text(alphabet="ACGTN", max_size=200))
def test_reverse_complement_is_an_involution(s):
    t = encode(s)
    rc = reverse_complement(t)
    assert decode(rc) == s[::-1].translate(str.maketrans("ACGTN", "TGCAN"))
    assert np.array_equal(reverse_complement(rc), t)


@given(st.lists(st.booleans(), max_size=100))
def test_mask_packing_round_trip(bits):
    mask = np.array(bits, dtype=bool)
    assert np.array_equal(unpack_mask(np.packbits(mask), len(mask)), mask)
