"""The leakage mask (`prepare --leakage-k`): held-out bases covered by an exact K-mer that also occurs in
the training chromosomes. `KmerIndex` holds their canonical K-mers (K <= 32: the smaller 2-bit code of the
K-mer and its reverse complement, so either strand matches; K-mers with a base other than A, C, G, T are
skipped, case is ignored) in one sorted, deduplicated uint64 array queried with `np.searchsorted`: exact,
unlike a Bloom filter. Work is done in chunks of `CHUNK` K-mers."""

from __future__ import annotations

import logging
import time

import numpy as np
from tqdm import tqdm

from genome_lm.genome.tokenizer import TOKEN_MASK

log = logging.getLogger(__name__)

CHUNK = 1 << 22  # K-mers per step of the build and the query


def _forward_codes(v: np.ndarray, k: int) -> np.ndarray:
    """2-bit codes uint64 [L - k + 1] of the k-mers of `v` (uint64 [L], values 0..3), by doubling:
    codes of length 1, 2, 4, ... joined along the binary digits of k (log2(k) passes, not k)."""
    out, olen, p, plen, bits = None, 0, v, 1, k
    while True:
        if bits & 1:
            if out is None:
                out, olen = p, plen
            else:  # append the plen-mer that starts olen bases later
                m = len(v) - olen - plen + 1
                out = (out[:m] << np.uint64(2 * plen)) | p[olen : olen + m]
                olen += plen
        bits >>= 1
        if not bits:
            assert out is not None  # k >= 1: the lowest set bit of k filled it
            return out
        p = (p[:-plen] << np.uint64(2 * plen)) | p[plen:]
        plen *= 2


def canonical_kmers(codes: np.ndarray, k: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Canonical codes uint64 [n] and validity bool [n] (only A, C, G, T) of the k-mers starting at
    start..stop-1 of `codes` (token ids or prepare's codes: soft-mask bits are ignored)."""
    seg = codes[start : stop + k - 1] & TOKEN_MASK  # uint8 [n + k - 1]
    bad = seg > 3
    cs = np.zeros(len(seg) + 1, dtype=np.int32)
    np.cumsum(bad, out=cs[1:])
    valid = cs[k:] == cs[:-k]  # [n]: no bad base in [i, i + k)
    v = np.where(bad, 0, seg).astype(np.uint64)
    fwd = _forward_codes(v, k)
    rev = _forward_codes(np.uint64(3) - v[::-1], k)[::-1]  # reverse complement of each k-mer
    return np.minimum(fwd, rev), valid


def _chunks(n: int, desc: str, disable: bool | None):
    with tqdm(total=n, unit="bp", unit_scale=True, desc=desc, disable=disable, leave=False) as bar:
        for i0 in range(0, n, CHUNK):
            i1 = min(n, i0 + CHUNK)
            yield i0, i1
            bar.update(i1 - i0)


class KmerIndex:
    """The canonical k-mers of the chromosomes `add`ed, then `finalize`d for `mask`. Memory: 8 bytes per
    k-mer added (one array, grown in place), 8 per distinct k-mer once finalized, ~50 x CHUNK bytes more."""

    def __init__(self, k: int, show_progress: bool | None = None):
        self.k = k  # 1..params.MAX_K (`PrepareParams` checks --leakage-k)
        self.disable = None if show_progress is None else not show_progress  # the bars'; None: only on a TTY
        self.codes = np.empty(0, dtype=np.uint64)
        self.added = 0  # valid k-mers added (with repeats)
        self.sources: list[str] = []
        self.finalized = False

    def add(self, codes: np.ndarray, name: str = "") -> None:
        """Add the valid canonical k-mers of one chromosome (uint8 [T])."""
        assert not self.finalized, "KmerIndex.add after finalize"
        t0, n = time.perf_counter(), max(0, len(codes) - self.k + 1)
        w = len(self.codes)
        self.codes.resize(w + n, refcheck=False)  # realloc: grows in place (mremap), no second copy
        for i0, i1 in _chunks(n, f"leakage index {name}", self.disable):
            canon, valid = canonical_kmers(codes, self.k, i0, i1)
            kept = canon[valid]
            self.codes[w : w + len(kept)] = kept
            w += len(kept)
        added = w - (len(self.codes) - n)
        self.codes.resize(w, refcheck=False)
        self.added += added
        self.sources.append(name)
        log.info("leakage index: %s: %s valid %d-mers of %s bases (%.1fs; index %.2f GB)", name or "sequence",
                 f"{added:,}", self.k, f"{len(codes):,}", time.perf_counter() - t0, self.codes.nbytes / 1e9)

    def finalize(self) -> "KmerIndex":
        """Sort in place and drop repeated k-mers (in place, chunk by chunk)."""
        t0 = time.perf_counter()
        self.codes.sort()
        self.codes.resize(_dedupe_sorted(self.codes), refcheck=False)  # no view of it is left
        self.finalized = True
        log.info("leakage index: %s distinct canonical %d-mers of %s (%s added) in %.2f GB (sorted in %.1fs)",
                 f"{len(self.codes):,}", self.k, ", ".join(self.sources) or "nothing", f"{self.added:,}",
                 self.codes.nbytes / 1e9, time.perf_counter() - t0)
        return self

    def mask(self, codes: np.ndarray, name: str = "") -> np.ndarray:
        """bool [T]: position p is covered by a k-mer [i, i + k) in the index (i <= p < i + k)."""
        assert self.finalized, "KmerIndex: call finalize() after the last add()"
        t0 = time.perf_counter()
        hits = np.zeros(max(0, len(codes) - self.k + 1), dtype=bool)  # [i]: the k-mer at i is valid and indexed
        for i0, i1 in _chunks(len(hits), f"leakage mask {name}", self.disable):
            canon, valid = canonical_kmers(codes, self.k, i0, i1)
            if len(self.codes):
                pos = np.flatnonzero(valid)
                order = np.argsort(canon[pos])
                q = canon[pos][order]  # sorted queries: searchsorted walks the index in order (~15x faster)
                idx = np.searchsorted(self.codes, q)
                np.minimum(idx, len(self.codes) - 1, out=idx)
                hits[i0 + pos[order]] = self.codes[idx] == q
        covered = cover(hits, self.k, len(codes))
        log.info("leakage mask: %s: %s of %s bases (%.2f%%) covered by a training %d-mer (%.1fs)", name or "sequence",
                 f"{int(covered.sum()):,}", f"{len(codes):,}", 100 * covered.mean() if len(codes) else 0.0,
                 self.k, time.perf_counter() - t0)
        return covered


def _dedupe_sorted(a: np.ndarray) -> int:
    """Move the distinct values of the sorted array `a` to its front, chunk by chunk; returns their count."""
    w, last = 0, None
    for i0 in range(0, len(a), CHUNK):
        chunk = a[i0 : i0 + CHUNK]
        keep = np.empty(len(chunk), dtype=bool)
        keep[0] = last is None or chunk[0] != last
        np.not_equal(chunk[1:], chunk[:-1], out=keep[1:])
        last = chunk[-1].copy()
        kept = chunk[keep]  # a copy; writes go to [w, w + len) with w <= i0, behind the reads
        a[w : w + len(kept)] = kept
        w += len(kept)
    return w


def cover(hits: np.ndarray, k: int, length: int) -> np.ndarray:
    """bool [length]: p is covered when hits[i] for some i in [p - k + 1, p] (hits: bool [length - k + 1]),
    by doubling: out[p] = any hit in [p - w + 1, p] for w = 1, 2, 4, ... up to k."""
    out = np.zeros(length, dtype=bool)
    out[: len(hits)] = hits
    w = 1
    while w < k:
        s = min(w, k - w)
        out[s:] |= out[:-s]  # numpy reads the overlapping input from a copy
        w += s
    return out
