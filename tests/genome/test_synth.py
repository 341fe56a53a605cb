"""The synthetic genome: deterministic bytes, hg38-like layout, and repeat copies that really
are near-identical to their sources at the planted distances."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.genome.params import SynthParams, make_params
from genome_lm.genome.synth import (
    read_repeats,
    read_segdups,
    repeats_path,
    segdups_path,
    synthesize,
    synthesize_genome,
    write_synthetic_fasta,
)

SCALE = 0.25  # 1 Mbp in total: big enough for every structure, fast enough for every test
VALID = set(b"ACGTNacgt") | set(b"RYKMSWBDHV")
COMPLEMENT = bytes.maketrans(b"ACGTacgt", b"TGCAtgca")


@pytest.fixture(scope="module")
def genome():
    return synthesize_genome(scale=SCALE, seed=7)


def read_fasta_gz(path) -> tuple[dict[str, bytes], list[bytes]]:
    lines = gzip.decompress(path.read_bytes()).split(b"\n")
    assert lines[-1] == b""  # ends with a newline
    records, name = {}, None
    for line in lines[:-1]:
        if line.startswith(b">"):
            name = line[1:].decode()
            records[name] = []
        else:
            records[name].append(line)
    return {k: b"".join(v) for k, v in records.items()}, lines[:-1]


def oriented(seq: bytes, start: int, end: int, strand: str) -> bytes:
    """The copy in its family's orientation, uppercased."""
    s = seq[start:end].upper()
    return s.translate(COMPLEMENT)[::-1] if strand == "-" else s


def kmer_share(a: bytes, b: bytes, k: int = 12) -> float:
    """Fraction of a's k-mers that occur in b."""
    ka = {a[i : i + k] for i in range(len(a) - k + 1)}
    kb = {b[i : i + k] for i in range(len(b) - k + 1)}
    return len(ka & kb) / max(len(ka), 1)


def test_same_seed_same_bytes_and_different_seed_differs(tmp_path):
    a = write_synthetic_fasta(tmp_path / "a.fa.gz", scale=0.05, seed=3)
    b = write_synthetic_fasta(tmp_path / "b.fa.gz", scale=0.05, seed=3)
    c = write_synthetic_fasta(tmp_path / "c.fa.gz", scale=0.05, seed=4)
    assert a.fasta.read_bytes() == b.fasta.read_bytes()
    assert a.repeats.read_bytes() == b.repeats.read_bytes()
    assert a.fasta.read_bytes() != c.fasta.read_bytes()
    assert synthesize(scale=0.05, seed=3) == read_fasta_gz(a.fasta)[0]
    assert not list(tmp_path.glob(".*"))  # no temporary files left


def test_records_lengths_and_line_width(tmp_path):
    written = write_synthetic_fasta(tmp_path / "g.fa.gz", scale=0.1)
    records, lines = read_fasta_gz(written.fasta)
    expected = {c.name: round(c.length * 0.1) for c in SynthParams().chroms}
    assert list(records) == ["chr1", "chr2", "chr22"]
    assert {k: len(v) for k, v in records.items()} == expected == written.lengths
    seq_lines = [line for line in lines if not line.startswith(b">")]
    assert max(map(len, seq_lines)) == 60
    assert sum(len(line) < 60 for line in seq_lines) <= 3  # only each record's last line
    assert written.repeats == repeats_path(written.fasta) == tmp_path / "g.repeats.tsv"


def test_default_genome_is_a_few_mbp():
    lengths = {c.name: c.length for c in SynthParams().chroms}
    assert 3_500_000 <= sum(lengths.values()) <= 4_500_000
    assert lengths["chr1"] > lengths["chr2"] > lengths["chr22"]


def test_only_valid_characters_and_some_iupac(genome):
    for name, seq in genome.sequences.items():
        assert set(seq) <= VALID, name
        assert re.search(rb"[RYKMSWBDHV]", seq), f"{name} has no IUPAC code"


def test_n_runs_at_ends_centromere_short_arm_and_inside(genome):
    for spec in SynthParams().chroms:
        seq = genome.sequences[spec.name]
        runs = [(m.start(), m.end()) for m in re.finditer(rb"N+", seq)]
        assert runs[0][0] == 0 and runs[-1][1] == len(seq)  # telomeres
        mid = spec.centromere * len(seq)
        assert any(s <= mid < e and e - s >= 0.02 * len(seq) for s, e in runs), "centromere"
        assert any(100 <= e - s <= 500 for s, e in runs), "short N run inside an arm"
        if spec.short_arm:
            assert 0.15 <= runs[0][1] / len(seq) <= 0.20
    assert genome.sequences["chr22"][:1000] == b"N" * 1000


def test_lowercase_fraction_matches_planted_copies(genome):
    total = sum(len(s) - s.count(b"N") for s in genome.sequences.values())
    lower = sum(sum(1 for _ in re.finditer(rb"[acgt]", s)) for s in genome.sequences.values())
    assert 0.30 <= lower / total <= 0.50
    assert lower == sum(c.end - c.start for c in genome.copies)
    assert genome.repeat_fraction() == pytest.approx(lower / total)
    for c in genome.copies[:200]:
        assert genome.sequences[c.chrom][c.start : c.end].islower()


def test_background_gc_varies_and_cpg_is_depleted(genome):
    seq = np.frombuffer(genome.sequences["chr1"], dtype=np.uint8)
    upper = (seq == ord("A")) | (seq == ord("C")) | (seq == ord("G")) | (seq == ord("T"))
    gc_windows = []
    for i in range(0, len(seq) - 10_000, 10_000):
        w, u = seq[i : i + 10_000], upper[i : i + 10_000]
        if u.sum() > 5_000:
            gc_windows.append(np.isin(w[u], [ord("C"), ord("G")]).mean())
    assert max(gc_windows) - min(gc_windows) > 0.08
    assert 0.33 < np.median(gc_windows) < 0.55
    background = b"".join(re.findall(rb"[ACGT]+", genome.sequences["chr1"]))
    n = len(background)
    observed = background.count(b"CG") / n
    expected = (background.count(b"C") / n) * (background.count(b"G") / n)
    assert observed / expected < 0.45  # ~0.3 with 75% depletion; ~1.0 without


def test_copies_are_near_identical_to_their_sources_at_planted_distances(genome):
    by_start = {(c.chrom, c.start): c for c in genome.copies}
    params = SynthParams()
    distances, shares, founder_shares = [], [], []
    for c in genome.copies:
        seq = genome.sequences[c.chrom]
        copy = oriented(seq, c.start, c.end, c.strand)
        if c.source_start < 0:  # founder: ~10% from the family consensus
            founder_shares.append(kmer_share(copy, genome.families[c.family]))
            continue
        src = by_start[(c.chrom, c.source_start)]
        assert src.family == c.family
        d = c.start - src.start
        assert params.min_distance <= d <= params.max_distance and src.end <= c.start
        distances.append(d)
        shares.append(kmer_share(copy, oriented(seq, src.start, src.end, src.strand)))
    # 3% substitutions and a few indels keep ~0.97^12 = 69% of 12-mers; unrelated: ~0%.
    assert np.median(shares) > 0.6 and min(shares) > 0.2
    assert np.median(founder_shares) > 0.2 and min(founder_shares) > 0.03  # 0.9^12 = 28%
    assert min(distances) < 4_000 and max(distances) > 32_000  # short and long range
    assert sum(c.strand == "-" for c in genome.copies) > 0.15 * len(genome.copies)


def test_without_indels_copies_differ_from_sources_by_about_the_substitution_rate():
    g = synthesize_genome(scale=0.05, seed=1, params=make_params(indel_rate=0.0))
    by_start = {(c.chrom, c.start): c for c in g.copies}
    diffs = []
    for c in g.copies:
        if c.source_start >= 0:
            src = by_start[(c.chrom, c.source_start)]
            a = np.frombuffer(oriented(g.sequences[c.chrom], c.start, c.end, c.strand), np.uint8)
            b = np.frombuffer(oriented(g.sequences[c.chrom], src.start, src.end, src.strand), np.uint8)
            assert len(a) == len(b)
            diffs.append((a != b).mean())
    assert 0.02 < np.mean(diffs) < 0.04


def test_tandem_arrays_are_contiguous_diverging_lowercase_units():
    p = make_params(tandem_fraction=0.3, tandem_unit_min=10, tandem_unit_max=40, tandem_divergence=0.05)
    g = synthesize_genome(scale=0.05, seed=3, params=p)
    units = [c for c in g.copies if c.family == "tandem"]
    by_start = {(c.chrom, c.start): c for c in units}
    diffs, lengths = [], set()
    for c in units:
        unit = g.sequences[c.chrom][c.start : c.end]
        assert unit.islower() and 10 <= c.end - c.start <= 40 and c.strand == "+"
        if c.source_start >= 0:
            src = by_start[(c.chrom, c.source_start)]
            assert src.end == c.start and src.end - src.start == c.end - c.start  # head to tail, same length
            a, b = (np.frombuffer(g.sequences[c.chrom][x.start : x.end], np.uint8) for x in (c, src))
            diffs.append((a != b).mean())
        lengths.add(c.end - c.start)
    sizes, n = [], 0  # units per array: a chain of head-to-tail units starting at a source -1
    for c in sorted(units, key=lambda c: (c.chrom, c.start)):
        if c.source_start < 0 and n:
            sizes.append(n)
            n = 0
        n += 1
    sizes.append(n)
    assert min(sizes) >= p.tandem_copies_min and max(sizes) <= p.tandem_copies_max and len(set(sizes)) > 5
    non_n = sum(len(s) - s.count(b"N") for s in g.sequences.values())
    assert 0.25 < sum(c.end - c.start for c in units) / non_n < 0.4
    assert 0.035 < np.mean(diffs) < 0.065 and len(lengths) > 10
    # the interspersed copies are still planted, and tandem_fraction 0 (the default) plants none
    assert any(c.family != "tandem" for c in g.copies)
    assert not any(c.family == "tandem" for c in synthesize_genome(scale=0.05, seed=3).copies)


SEGDUPS = dict(segdup_count=8, segdup_region=(0.2, 0.9))


def test_segmental_duplications_copy_earlier_records_into_chr22():
    g = synthesize_genome(scale=SCALE, seed=7, params=make_params(**SEGDUPS))
    plain = synthesize_genome(scale=SCALE, seed=7)
    assert plain.segdups == [] and g.sequences["chr1"] == plain.sequences["chr1"]  # only chr22 changes
    assert g.sequences["chr2"] == plain.sequences["chr2"] and g.sequences["chr22"] != plain.sequences["chr22"]
    assert len(g.segdups) == 2 and {d.strand for d in g.segdups} == {"+", "-"}  # round(8 x 0.25)
    chr22 = g.sequences["chr22"]
    for d in g.segdups:
        assert d.chrom == "chr22" and d.source_chrom in ("chr1", "chr2") and 1000 <= d.end - d.start <= 8000
        assert 0.2 * len(chr22) <= d.start and d.end <= 0.9 * len(chr22)
        copy = chr22[d.start : d.end]
        src = oriented(g.sequences[d.source_chrom], d.source_start, d.source_end, d.strand)
        assert copy.isupper() and len(copy) == len(src) and b"N" not in copy
        iupac = len(re.findall(rb"[RYKMSWBDHV]", copy))  # placed after, in uppercase background
        assert sum(a != b for a, b in zip(copy, src)) == d.substitutions + iupac
        assert d.substitutions < 0.01 * len(copy)
    # the repeat copies are planted around them: lowercase is still exactly the listed copies
    lower = sum(len(re.findall(rb"[acgt]", s)) for s in g.sequences.values())
    assert lower == sum(c.end - c.start for c in g.copies)
    assert not any(c.start < d.end and d.start < c.end for c in g.copies if c.chrom == "chr22" for d in g.segdups)


def test_segdup_sidecar_and_bad_parameters(tmp_path):
    written = write_synthetic_fasta(tmp_path / "g.fa.gz", scale=0.05, seed=2, params=make_params(**SEGDUPS))
    assert written.segdups == segdups_path(written.fasta) == tmp_path / "g.segdups.tsv"
    want = synthesize_genome(scale=0.05, seed=2, params=make_params(**SEGDUPS)).segdups
    assert read_segdups(written.segdups) == want and len(want) == 1
    again = write_synthetic_fasta(tmp_path / "g.fa.gz", scale=0.05, seed=2, overwrite=True)
    assert again.segdups is None and not segdups_path(written.fasta).exists()  # no stale sidecar
    for bad, named in [({"segdup_into": "chr1"}, "segdup_into"), ({"segdup_region": (0.5, 0.2)}, "segdup_region"),
                       ({"segdup_min_len": 0}, "segdup_min_len")]:
        with pytest.raises(GenomeLMError, match=named):
            make_params(segdup_count=1, **bad)


def test_sidecar_tsv_lists_the_planted_copies(tmp_path):
    written = write_synthetic_fasta(tmp_path / "g.fa.gz", scale=0.05, seed=2)
    assert read_repeats(written.repeats) == synthesize_genome(scale=0.05, seed=2).copies
    assert written.repeats.read_text().startswith("chrom\tstart\tend\tstrand\tfamily\tsource_start\n")


def test_refuses_to_overwrite_unless_asked(tmp_path):
    out = tmp_path / "g.fa.gz"
    write_synthetic_fasta(out, scale=0.02, seed=0)
    before = out.read_bytes()
    with pytest.raises(GenomeLMError, match="already exists.*--overwrite"):
        write_synthetic_fasta(out, scale=0.02, seed=1)
    assert out.read_bytes() == before
    write_synthetic_fasta(out, scale=0.02, seed=1, overwrite=True)
    assert out.read_bytes() != before


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"scale": 0.0}, "too small"),
        ({"scale": 0.001}, "too small"),
        ({"n_families": 0}, "n_families"),
        ({"tandem_fraction": 0.6, "repeat_fraction": 0.4}, "repeat_fraction \\+ tandem_fraction < 0.9"),
        ({"tandem_copies_min": 1}, "tandem_copies_min"),
        ({"no_such_field": 1}, "unknown no_such_field"),
    ],
)
def test_bad_parameters_are_user_errors(kwargs, match):
    with pytest.raises(GenomeLMError, match=match):
        synthesize(**kwargs)


def test_output_must_be_gzip_named(tmp_path):
    with pytest.raises(GenomeLMError, match=r"\.fa\.gz"):
        write_synthetic_fasta(tmp_path / "g.fa", scale=0.02)


def test_cli_writes_then_refuses_without_traceback(tmp_path, capsys):
    out = tmp_path / "sub" / "g.fa.gz"
    assert main(["synth", "--out", str(out), "--scale", "0.02"]) == 0
    assert out.exists() and repeats_path(out).exists()
    assert main(["synth", "--out", str(out), "--scale", "0.02"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--overwrite" in err and "Traceback" not in err


def test_cli_set_overrides_reach_the_genome_and_bad_ones_are_named(tmp_path, capsys):
    out = tmp_path / "g.fa.gz"
    args = ["synth", "--out", str(out), "--scale", "0.05", "--seed", "3"]
    assert main([*args, "--set", "max_distance=8192", "--set", "substitution_rate=0.01"]) == 0
    want = synthesize_genome(scale=0.05, seed=3, params=make_params(max_distance=8192, substitution_rate=0.01))
    assert read_repeats(repeats_path(out)) == want.copies
    assert want.copies != synthesize_genome(scale=0.05, seed=3).copies
    for bad, named in [("max_dist=8192", "max_distance"), ("max_distance=8k", "an integer"),
                       ("min_distance=70000", "min_distance <= max_distance")]:
        fresh = tmp_path / "bad" / "g.fa.gz"
        assert main(["synth", "--out", str(fresh), "--scale", "0.05", "--set", bad]) == 2
        err = capsys.readouterr().err
        assert named in err and "Traceback" not in err and not fresh.exists()


def test_cli_config_file_and_set(tmp_path, capsys):
    cfg = tmp_path / "synth.yaml"
    cfg.write_text("max_distance: 8192\nsubstitution_rate: 0.5\n")
    out = tmp_path / "g.fa.gz"
    assert main(["synth", "--out", str(out), "--scale", "0.05", "--seed", "3", "--config", str(cfg),
                 "--set", "substitution_rate=0.01"]) == 0
    want = synthesize_genome(scale=0.05, seed=3, params=make_params(max_distance=8192, substitution_rate=0.01))
    assert read_repeats(repeats_path(out)) == want.copies
    cfg.write_text("n_familes: 3\n")
    assert main(["synth", "--out", str(tmp_path / "h.fa.gz"), "--config", str(cfg)]) == 2
    assert "synth.yaml: unknown key n_familes; did you mean n_families?" in capsys.readouterr().err


@pytest.mark.parametrize("flags,expected", [
    (["--seed", "-1"], "--seed -1: give a whole number >= 0"),
    (["--scale", "1e12"], "asks for 4,000,000,000,000,000,000 bases; the genome is built in memory, up to "
                          "1,000,000,000 bases (--scale 250)"),
    (["--scale", "inf"], "--scale inf asks for inf bases"),
    (["--scale", "nan"], "--scale nan is too small"),
])
def test_a_seed_or_scale_it_cannot_use_is_one_line(tmp_path, capsys, flags, expected):
    from genome_lm.cli import main

    assert main(["synth", "--out", str(tmp_path / "g.fa.gz"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_out_as_a_folder_and_a_failed_write_leave_nothing(tmp_path, monkeypatch):
    from genome_lm.errors import GenomeLMError
    from genome_lm.genome import synth

    with pytest.raises(GenomeLMError, match=r"--out \. is a folder; give the FASTA file to write, e\.g\. genome"):
        write_synthetic_fasta(".", scale=0.01)

    def full_disk(name, seq):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(synth, "fasta_lines", full_disk)  # the FASTA fails after the sidecars are written
    with pytest.raises(OSError):
        write_synthetic_fasta(tmp_path / "g.fa.gz", scale=0.01)
    assert list(tmp_path.iterdir()) == []
