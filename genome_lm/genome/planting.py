"""How `synth` plants the synthetic genome's features (`synth.py` calls these per record): random
and mutated bases, the repeat families, N runs, interval occupancy, interspersed repeat clusters and
tandem arrays. Arrays of base codes 0..3 = A, C, G, T (`UPPER` / `LOWER` map them to ASCII);
coordinates 0-based, half-open."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from genome_lm.genome.synth_params import SPACER, ChromSpec, SynthParams

UPPER = np.frombuffer(b"ACGT", dtype=np.uint8)  # code 0..3 -> ASCII; complement is 3 - code
LOWER = np.frombuffer(b"acgt", dtype=np.uint8)
N = ord("N")


@dataclass(frozen=True)
class RepeatCopy:
    """One planted copy: genome[start:end] (reverse-complemented if strand '-') is the copy in
    its family's orientation; `source_start` is the start of the copy it was mutated from, or
    -1 for a cluster founder (mutated from the family consensus)."""

    chrom: str
    start: int
    end: int
    strand: str
    family: str
    source_start: int


# --- sequence helpers -----------------------------------------------------------------

def random_bases(rng: np.random.Generator, gc: np.ndarray | float, n: int) -> np.ndarray:
    """n independent bases, position i with GC fraction gc[i] (C and G equally likely)."""
    r = rng.random(n)
    gc = np.broadcast_to(np.asarray(gc, dtype=np.float64), (n,))
    at_cut = gc + (1.0 - gc) / 2
    idx = (r >= gc / 2).astype(np.uint8) + (r >= gc) + (r >= at_cut)  # 0 C, 1 G, 2 A, 3 T
    return np.array([1, 2, 0, 3], dtype=np.uint8)[idx]


def substitute(rng: np.random.Generator, seq: np.ndarray, rate: float) -> np.ndarray:
    """Each base changes to one of the three others with probability `rate`."""
    hit = rng.random(len(seq)) < rate
    out = seq.copy()
    out[hit] = (out[hit] + rng.integers(1, 4, size=int(hit.sum()), dtype=np.uint8)) % 4
    return out


def indels(rng: np.random.Generator, seq: np.ndarray, rate: float) -> np.ndarray:
    """Small insertions and deletions (1-3 bp each), about `rate` events per base."""
    n_events = rng.poisson(rate * len(seq))
    if n_events == 0:
        return seq
    pos = rng.integers(0, len(seq), size=n_events)
    size = rng.integers(1, 4, size=n_events)
    is_del = rng.random(n_events) < 0.5
    keep = np.ones(len(seq), dtype=bool)
    for p, s in zip(pos[is_del], size[is_del]):
        keep[p : p + s] = False
    ins_at = np.repeat(pos[~is_del], size[~is_del])
    out = np.insert(seq, ins_at, rng.integers(0, 4, size=len(ins_at), dtype=np.uint8))
    return out[np.insert(keep, ins_at, True)]


def first(tries: int, draw, ok):
    """The first of up to `tries` values `draw()` for which `ok(value)` holds, else None."""
    for _ in range(tries):
        if ok(x := draw()):
            return x
    return None


def make_families(rng: np.random.Generator, p: SynthParams) -> dict[str, np.ndarray]:
    lo, hi = np.log(p.family_min_len), np.log(p.family_max_len)
    lengths = np.exp(rng.uniform(lo, hi, size=p.n_families)).astype(int)
    gcs = rng.uniform(0.38, 0.55, size=p.n_families)
    return {f"fam{i:02d}": random_bases(rng, g, n) for i, (n, g) in enumerate(zip(lengths, gcs))}


# --- planting into one record ---------------------------------------------------------

def n_runs(rng: np.random.Generator, spec: ChromSpec, length: int, scale: float,
            p: SynthParams) -> list[tuple[int, int]]:
    """Sorted, disjoint N runs [start, end): telomeres, short arm, centromere, inner gaps."""
    tel = max(50, min(round(p.telomere * scale), length // 20))
    runs = [(0, max(tel, round(spec.short_arm * length))), (length - tel, length)]
    half_cen = max(25, round(p.centromere_frac * length / 2))
    mid = round(spec.centromere * length)
    runs.append((mid - half_cen, mid + half_cen))
    def draw():
        gap = int(rng.integers(p.inner_gap_min, p.inner_gap_max + 1))
        a = int(rng.integers(0, length - gap))
        return a, a + gap

    for _ in range(max(1, round(length / p.inner_gap_every))):
        if gap := first(100, draw, lambda g: all(g[1] + 1000 <= s or e + 1000 <= g[0] for s, e in runs)):
            runs.append(gap)
    return sorted(runs)


class Occupancy:
    """Disjoint intervals already used (N runs, placed copies), for O(log n) overlap tests."""

    def __init__(self, length: int, runs: list[tuple[int, int]]):
        self.length = length
        self.starts, self.ends = map(list, zip(*runs))

    def free(self, a: int, b: int) -> bool:
        if a < 0 or b > self.length:
            return False
        i = bisect.bisect_left(self.starts, b + SPACER) - 1
        return i < 0 or self.ends[i] + SPACER <= a

    def room(self, a: int) -> int:
        """The largest b such that [a, b) is free (a itself when a is not free)."""
        i = bisect.bisect_right(self.starts, a) - 1
        if a < 0 or (i >= 0 and self.ends[i] + SPACER > a):
            return a
        nxt = self.starts[i + 1] - SPACER if i + 1 < len(self.starts) else self.length
        return max(a, nxt)

    def add(self, a: int, b: int) -> None:
        i = bisect.bisect_left(self.starts, a)
        self.starts.insert(i, a)
        self.ends.insert(i, b)


def plant_repeats(rng, name, seq, occ, families, p: SynthParams) -> list[RepeatCopy]:
    """Place clusters of copies into `seq` (ASCII, modified in place) until the target share."""
    names = list(families)
    target = p.repeat_fraction * int((seq != N).sum())
    copies: list[RepeatCopy] = []
    covered, failures = 0, 0
    log_max = np.log(p.max_distance)
    while covered < target and failures < 200:
        fam = names[rng.integers(len(names))]
        oriented = substitute(rng, families[fam], p.founder_divergence)
        start = first(50, lambda: int(rng.integers(0, len(seq) - len(oriented))),
                       lambda a: occ.free(a, a + len(oriented)))
        if start is None:
            failures += 1
            continue
        source_start = -1
        for k in range(1 + int(rng.geometric(1.0 / (p.mean_copies - 1)))):
            strand = "-" if rng.random() < p.reverse_fraction else "+"
            end = start + len(oriented)
            seq[start:end] = LOWER[(3 - oriented)[::-1] if strand == "-" else oriented]  # '-': reverse complement
            occ.add(start, end)
            copies.append(RepeatCopy(name, start, end, strand, fam, source_start))
            covered += end - start
            # The next copy: this one mutated, d bases downstream (start to start).
            child = indels(rng, substitute(rng, oriented, p.substitution_rate), p.indel_rate)
            lo = np.log(max(p.min_distance, end - start + SPACER))
            nxt = first(8, lambda: start + int(np.exp(rng.uniform(lo, log_max))),
                         lambda a: occ.free(a, a + len(child)))
            if nxt is None or covered >= target:
                break
            source_start, start, oriented = start, nxt, child
    return copies


def plant_tandems(rng, name, seq, occ, p: SynthParams) -> list[RepeatCopy]:
    """Tandem arrays (satellite-like, lowercase): a random unit repeated head to tail, each unit
    the previous one with `tandem_divergence` substitutions; one RepeatCopy per unit (family
    'tandem', source = the unit before it, -1 for the first)."""
    target = p.tandem_fraction * int((seq != N).sum())
    copies: list[RepeatCopy] = []
    covered, failures = 0, 0
    lo, hi = np.log(p.tandem_unit_min), np.log(p.tandem_unit_max)
    while covered < target and failures < 200:
        u = int(np.exp(rng.uniform(lo, hi)))
        n = int(rng.integers(p.tandem_copies_min, p.tandem_copies_max + 1))
        a = int(rng.integers(0, len(seq) - u * n))
        n = min(n, (occ.room(a) - a) // u)  # shorten the array to the free stretch at a
        if n < p.tandem_copies_min:
            failures += 1
            continue
        failures = 0  # give up after 200 misses in a row, not in total
        unit = random_bases(rng, rng.uniform(p.gc_min, p.gc_max), u)
        pos, source = a, -1
        for _ in range(n):
            seq[pos : pos + u] = LOWER[unit]
            copies.append(RepeatCopy(name, pos, pos + u, "+", "tandem", source))
            source, pos = pos, pos + u
            unit = substitute(rng, unit, p.tandem_divergence)
        occ.add(a, pos)
        covered += pos - a
    return copies
