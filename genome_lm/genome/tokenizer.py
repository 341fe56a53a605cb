"""Single-nucleotide tokens, one byte each: A=0, C=1, G=2, T=3, N=4 (IUPAC codes are N; lowercase is
the same token, its case kept as the repeat mask).

FASTA bytes are first mapped to *codes*: the token id in bits 0-2, `SOFTMASK_BIT` (bit 3) for lowercase,
and for ambiguity codes their 1-based index in `IUPAC_CODES` in bits 4-7; other bytes map to `INVALID`."""

from __future__ import annotations

import numpy as np

VOCAB: dict[str, int] = {"A": 0, "C": 1, "G": 2, "T": 3, "N": 4}
ID_TO_BASE = np.frombuffer(b"ACGTN", dtype=np.uint8)
N_ID = VOCAB["N"]
IGNORE_INDEX = -100  # label of a target that is not scored (F.cross_entropy's default; Hugging Face causal LMs)

IUPAC_CODES = "RYSWKMBDHV"  # ambiguity codes other than N
TOKEN_MASK = 0b0000_0111
SOFTMASK_BIT = 0b0000_1000
IUPAC_SHIFT = 4  # codes >= 1 << IUPAC_SHIFT are ambiguity codes; code >> IUPAC_SHIFT is 1 + their index
INVALID = 0xFF


CODE_LUT = np.full(256, INVALID, dtype=np.uint8)  # FASTA byte -> code
for _char, _code in [*VOCAB.items(), *((c, N_ID | (i << IUPAC_SHIFT)) for i, c in enumerate(IUPAC_CODES, start=1))]:
    CODE_LUT[ord(_char)] = _code
    CODE_LUT[ord(_char.lower())] = _code | SOFTMASK_BIT

COMPLEMENT = np.array([3, 2, 1, 0, 4], dtype=np.uint8)  # on token ids: A<->T, C<->G, N->N


def encode(seq: str) -> np.ndarray:
    """DNA string -> token ids [T] uint8. Case-insensitive; IUPAC codes become N; other characters: ValueError."""
    codes = CODE_LUT[np.frombuffer(seq.encode("ascii", errors="replace"), dtype=np.uint8)]
    if (bad := np.flatnonzero(codes == INVALID)).size:
        raise ValueError(f"invalid base {seq[bad[0]]!r} at offset {bad[0]}")
    return codes & TOKEN_MASK


def decode(tokens: np.ndarray | list[int]) -> str:
    """Token ids [T] -> uppercase DNA string over A, C, G, T, N. `encode(decode(t)) == t`."""
    t = np.asarray(tokens)
    if t.size and (t.min() < 0 or t.max() >= len(ID_TO_BASE)):
        raise ValueError(f"token ids must lie in [0, {len(ID_TO_BASE)}); got range [{t.min()}, {t.max()}]")
    return ID_TO_BASE[t.astype(np.intp)].tobytes().decode("ascii")


def reverse_complement(tokens: np.ndarray) -> np.ndarray:
    """Token ids [T] -> reverse complement [T] (A<->T, C<->G, N->N)."""
    return COMPLEMENT[tokens[::-1]]


def unpack_mask(packed: np.ndarray, length: int) -> np.ndarray:
    """Inverse of `np.packbits` (the shards' repeat_mask): uint8 [ceil(T/8)] -> bool [T]."""
    return np.unpackbits(np.asarray(packed, dtype=np.uint8), count=length).astype(bool)
