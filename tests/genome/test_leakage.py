"""The leakage mask (`genome/leakage.py`, `prepare --leakage-k`): exactly the eval positions that a
K-mer of the training chromosomes covers, on either strand, against a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.genome import leakage, load_manifest, load_shards
from genome_lm.genome.leakage import KmerIndex, canonical_kmers
from genome_lm.genome.params import make_params
from genome_lm.genome.synth import synthesize_genome
from genome_lm.genome.tokenizer import CODE_LUT, SOFTMASK_BIT, encode, reverse_complement, unpack_mask

from .conftest import random_chrom, write_fasta
from .test_prepare import run_prepare

COMP = str.maketrans("ACGTacgtN", "TGCAtgcaN")


def codes_of(seq: str) -> np.ndarray:
    """prepare's codes (soft-mask bit kept) of a sequence string."""
    return CODE_LUT[np.frombuffer(seq.encode(), dtype=np.uint8)]


def reference_mask(train: list[str], ev: str, k: int) -> np.ndarray:
    """Brute force: a set of the training k-mers of both strands, uppercase, ACGT only."""
    def kmers(s: str):
        s = s.upper()
        return [s[i : i + k] for i in range(len(s) - k + 1)]

    known = set()
    for t in train:
        for km in kmers(t):
            if set(km) <= set("ACGT"):
                known |= {km, km.translate(COMP)[::-1]}
    mask = np.zeros(len(ev), dtype=bool)
    for i, km in enumerate(kmers(ev)):
        if km in known:
            mask[i : i + k] = True
    return mask


def mask_of(train: list[str], ev: str, k: int) -> np.ndarray:
    index = KmerIndex(k, show_progress=False)
    for i, t in enumerate(train):
        index.add(codes_of(t), f"t{i}")
    return index.finalize().mask(codes_of(ev))


def bases(rng, n: int) -> str:
    return random_chrom(rng, n, lower_frac=0).upper()


@pytest.mark.parametrize("strand", ["+", "-"])
def test_planted_copy_marks_exactly_its_bases(strand):
    rng = np.random.default_rng(0)
    train, ev = bases(rng, 4000), list(bases(rng, 3000))
    copy = train[1000:1200]
    copy = copy if strand == "+" else copy.translate(COMP)[::-1]
    ev[500:700] = copy
    mask = mask_of([train], "".join(ev), 32)
    want = np.zeros(3000, dtype=bool)
    want[500:700] = True
    # a chance match of the base beside the copy can extend it (1/4 per side); compare with the brute force
    assert (mask == reference_mask([train], "".join(ev), 32)).all()
    assert mask[500:700].all() and mask.sum() - 200 <= 4 and not mask[:490].any() and not mask[710:].any()


def test_copy_with_a_mismatch_every_k_bases_marks_nothing():
    rng = np.random.default_rng(1)
    k = 32
    train, ev = bases(rng, 4000), list(bases(rng, 3000))
    copy = list(train[1000:1600])
    for i in range(20, len(copy), k - 1):  # every window of k bases holds one substitution
        copy[i] = {"A": "C", "C": "G", "G": "T", "T": "A"}[copy[i]]
    ev[500:1100] = copy
    assert not mask_of([train], "".join(ev), k).any()
    copy[20] = train[1020]  # one mismatch fewer: the k-mers between two substitutions now match
    ev[500:1100] = copy
    mask = mask_of([train], "".join(ev), k)
    assert mask.any() and mask.sum() < 2 * k and (mask == reference_mask([train], "".join(ev), k)).all()


def test_kmers_with_n_or_iupac_codes_are_ignored():
    assert not mask_of(["A" * 16 + "N" + "A" * 15], "A" * 32, 32).any()  # N is not read as A (code 0)
    assert not mask_of(["C" * 20 + "R" + "C" * 11], "C" * 32, 32).any()
    rng = np.random.default_rng(2)
    original = bases(rng, 2000)
    train = original[:1016] + "N" + original[1017:1040] + "r" + original[1041:]
    ev = list(bases(rng, 1000))
    ev[100:164] = original[1000:1064]  # every 32-mer of it covers the train's N (16) or R (40)
    ev = "".join(ev)
    mask = mask_of([train], ev, 32)
    assert not mask[100:164].any() and (mask == reference_mask([train], ev, 32)).all()
    # an N in the eval sequence: the k-mers holding it do not match, the others do
    ev2 = list(bases(rng, 1000))
    ev2[100:300] = train[1100:1300]
    ev2[200] = "N"
    mask2 = mask_of([train], "".join(ev2), 32)
    assert mask2[100:200].all() and not mask2[200] and mask2[201:300].all()


def test_soft_masked_bases_match_case_insensitively():
    rng = np.random.default_rng(3)
    train = bases(rng, 3000)
    train = train[:1000] + train[1000:1500].lower() + train[1500:]
    ev = list(bases(rng, 2000))
    ev[300:700] = train[1200:1600].swapcase()  # half lowercase in train, the other half in eval
    ev = "".join(ev)
    mask = mask_of([train], ev, 32)
    assert mask[300:700].all()
    assert (mask == mask_of([train.upper()], ev.upper(), 32)).all()
    codes = codes_of(train)
    assert (codes[1000:1500] & SOFTMASK_BIT).all()  # the soft-mask bit really is set


def test_fast_index_equals_brute_force_on_random_inputs(monkeypatch):
    monkeypatch.setattr(leakage, "CHUNK", 13)  # many chunk boundaries on small inputs
    rng = np.random.default_rng(4)
    for trial in range(60):
        k = int(rng.integers(1, 33))
        alphabet = "ACGT"[: int(rng.integers(1, 5))] + ("N" if trial % 4 == 0 else "")
        train = ["".join(rng.choice(list(alphabet + alphabet.lower()), int(rng.integers(0, 150))))
                 for _ in range(int(rng.integers(1, 4)))]
        ev = "".join(rng.choice(list(alphabet), int(rng.integers(0, 150))))
        if len(train[0]) > 60 and trial % 2:  # plant a stretch of train, either strand
            a = int(rng.integers(0, len(train[0]) - 50))
            piece = train[0][a : a + 50]
            ev = ev[:20] + (piece.translate(COMP)[::-1] if trial % 3 else piece) + ev[20:]
        got, want = mask_of(train, ev, k), reference_mask(train, ev, k)
        assert (got == want).all(), (trial, k, train, ev)


def test_index_counts_and_reverse_complement_codes():
    t = encode("ACGTTGCAAC")
    canon, valid = canonical_kmers(t, 4, 0, len(t) - 3)
    rc = reverse_complement(t)
    canon_rc, _ = canonical_kmers(rc, 4, 0, len(t) - 3)
    assert valid.all() and sorted(canon) == sorted(canon_rc)  # a sequence and its reverse complement
    index = KmerIndex(4, show_progress=False)
    index.add(t, "a")
    index.add(t, "b")
    index.finalize()
    assert index.added == 14 and len(index.codes) == len(set(canon.tolist()))
    assert (np.diff(index.codes.astype(np.float64)) > 0).all()


def test_demo_genome_segdups_are_masked():
    from genome_lm.demo import DEMO_GENOME

    g = synthesize_genome(scale=0.5, seed=0, params=make_params(**DEMO_GENOME))
    mask = mask_of([g.sequences["chr1"].decode(), g.sequences["chr2"].decode()], g.sequences["chr22"].decode(), 32)
    inside = np.zeros(len(mask), dtype=bool)
    for d in g.segdups:
        inside[d.start : d.end] = True
        assert mask[d.start : d.end].mean() > 0.95, d  # a few substitutions (0.2%) leave a K-mer unmatched
    # elsewhere: homopolymer runs of the Markov background (poly-G and the like) that chr1/chr2 also hold
    assert len(g.segdups) >= 2 and mask[~inside].sum() < 0.1 * mask.sum()


# --- through prepare ---------------------------------------------------------------------------

@pytest.fixture
def leaky(tmp_path):
    """chr1, chr2 (train) and chr22 (eval) with two segments of chr1 and chr2 copied into chr22."""
    rng = np.random.default_rng(5)
    chr1 = random_chrom(rng, 5000, n_runs=[(0, 120)], iupac=2)
    chr2 = random_chrom(rng, 3333)
    chr22 = list(random_chrom(rng, 2100, n_runs=[(0, 700)]))
    chr22[900:1100] = chr1[3000:3200]
    chr22[1500:1800] = chr2[100:400].translate(COMP)[::-1]
    return {"chr1": chr1, "chr2": chr2, "chr22": "".join(chr22)}


@pytest.mark.parametrize("order", [["chr1", "chr2", "chr22"], ["chr22", "chr1", "chr2"]])
def test_prepare_writes_the_mask_and_counts_it(tmp_path, leaky, order):
    fa = write_fasta(tmp_path / "g.fa", {name: leaky[name] for name in order})
    manifest = run_prepare([fa], tmp_path / "out", leakage_k=32, stride=256)  # overlapping windows
    section = manifest["leakage_mask"]
    assert section["k"] == 32 and section["false_positive_rate"] == 0.0
    assert section["train_chroms"] == ["chr1", "chr2"]
    want = reference_mask([leaky["chr1"], leaky["chr2"]], leaky["chr22"], 32)
    ds = load_shards(tmp_path / "out", "eval")
    total = 0
    for row in ds:
        n = len(row["tokens"])
        got = unpack_mask(row["leakage_mask"], n)
        assert (got == want[row["start"] : row["end"]]).all()
        total += int(got.sum())
    assert total > 0
    assert section["masked_tokens"] == total == section["per_chrom"]["chr22"]["masked_tokens"]
    assert section["tokens"] == manifest["splits"]["eval"]["tokens"]
    assert section["fraction"] == pytest.approx(total / section["tokens"])
    assert manifest["splits"]["eval"]["per_chrom"]["chr22"]["leakage_masked_tokens"] == total
    assert "leakage_mask" not in load_shards(tmp_path / "out", "train").column_names
    assert "leakage_masked_tokens" not in manifest["splits"]["train"]["per_chrom"]["chr1"]
    assert manifest["parameters"]["leakage_k"] == 32


def test_without_the_flag_nothing_changes(tmp_path, leaky):
    fa = write_fasta(tmp_path / "g.fa", leaky)
    manifest = run_prepare([fa], tmp_path / "out")
    assert "leakage_mask" not in manifest and "leakage_k" not in manifest["parameters"]
    assert "leakage_mask" not in load_shards(tmp_path / "out", "eval").column_names
    assert "leakage_masked_tokens" not in manifest["splits"]["eval"]["per_chrom"]["chr22"]


def test_prepare_flag_errors_and_cli(tmp_path, leaky, capsys, caplog):
    fa = write_fasta(tmp_path / "g.fa", leaky)
    with pytest.raises(GenomeLMError, match="1..32"):
        run_prepare([fa], tmp_path / "a", leakage_k=40)
    with pytest.raises(GenomeLMError, match="needs both --train-chroms and --eval-chroms"):
        run_prepare([fa], tmp_path / "b", leakage_k=32, train_chroms="")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    out = tmp_path / "c"
    args = ["prepare", "--fasta", str(fa), "--seq-len", "512", "--min-len", "64", "--min-gap", "100", "--out", str(out)]
    assert main([*args, "--leakage-k", "33"]) == 2
    assert "--leakage-k" in capsys.readouterr().err and not out.exists()
    assert main([*args, "--leakage-k", "32"]) == 0
    assert load_manifest(out)["leakage_mask"]["masked_tokens"] > 0
    with caplog.at_level("INFO", logger="genome_lm.genome.prepare"):
        assert main([*args, "--leakage-k", "32"]) == 0  # a rerun is a no-op
    assert "already complete" in caplog.text
    assert main([*args, "--leakage-k", "24"]) == 2  # other parameters need --overwrite
