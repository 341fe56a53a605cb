"""`genome-lm variants` inputs and statistics: VCF reading (split alleles, aliases, REF check, labels, bad
files in one line each) and AUROC / AUPRC against a brute-force count."""

import gzip
import itertools

import numpy as np
import pytest

from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import Reference
from genome_lm.score.variants import auroc_auprc, metrics
from genome_lm.score.vcf import check_against, label_of, read_labels_tsv, read_vcf, with_labels

HEADER = "##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
SEQ = "ACGTACGTAC" * 10  # chr1 of the test FASTA: position p (1-based) holds SEQ[p - 1]


def vcf(tmp_path, records: list[str], header: str = HEADER, name: str = "v.vcf"):
    text = header + "".join(r.replace(" ", "\t") + "\n" for r in records)
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture
def ref(tmp_path):
    (tmp_path / "ref.fa").write_text(f">chr1\n{SEQ}\n>chr2\nGGGG\n")
    return Reference.load(tmp_path / "ref.fa", ["chr1", "chr7"], missing_ok=True)


def test_records_split_labelled_and_checked_against_the_reference(tmp_path, ref):
    path = vcf(tmp_path, ["1 2 a C A,G,<DEL> . . CLNSIG=Pathogenic,Benign,Benign",  # multi-allelic, alias 1
                          "chr1 5 b ACG A . . CLNSIG=Benign/Likely_benign",  # deletion
                          "chr1 9 c A AGT . . CLNSIG=Uncertain_significance",  # insertion
                          "chr1 11 d T C . . CLNSIG=Likely_pathogenic",  # REF mismatch: the FASTA has A
                          "chr1 13 f GT CA . . CLNSIG=Pathogenic",
                          "chr7 3 e A C . . ."], name="v.vcf.gz")  # a contig the FASTA lacks
    variants, symbolic = read_vcf(path, labels="CLNSIG")
    assert symbolic == 1
    assert [(v.chrom, v.pos, v.ref, v.alt, v.kind, v.label) for v in variants[:4]] == [
        ("1", 2, "C", "A", "snv", 1.0), ("1", 2, "C", "G", "snv", 0.0), ("chr1", 5, "ACG", "A", "del", 0.0),
        ("chr1", 9, "A", "AGT", "ins", None)]
    assert variants[-2].kind == "mnv"
    kept, skipped, listed = check_against(variants, ref)
    assert [v.id for v in kept] == ["a", "a", "b", "c", "f"]
    assert skipped == {"ref_mismatch": 1, "not_in_reference": 1}
    assert listed == ["chr1:11 T>C (fasta: A)"]


def test_labels_from_a_tsv_and_the_label_values():
    assert [label_of(v) for v in ("Pathogenic/Likely_pathogenic", "LOF", "FUNC", "INT", "Benign|Likely_benign",
                                  "Pathogenic/Benign", "Uncertain_significance", None)] == [1, 1, 0, 0, 0, None,
                                                                                          None, None]


def test_tsv_labels_match_by_alias(tmp_path):
    (tmp_path / "l.tsv").write_text("chrom\tpos\tref\talt\tlabel\nchr1\t2\tC\tA\tLOF\n1\t2\tC\tG\tFUNC\n")
    variants, _ = read_vcf(vcf(tmp_path, ["1 2 a C A,G,T . . ."]))
    assert [v.label for v in with_labels(variants, read_labels_tsv(tmp_path / "l.tsv"))] == [1.0, 0.0, None]


def test_most_ref_alleles_wrong_is_refused_as_another_assembly(tmp_path, ref):
    variants, _ = read_vcf(vcf(tmp_path, ["chr1 1 a C T . . .", "chr1 2 b G T . . .", "chr1 3 c G T . . ."]))
    with pytest.raises(GenomeLMError, match=r"2 of 3 REF alleles differ from the FASTA .*another assembly"):
        check_against(variants, ref)


@pytest.mark.parametrize("records, header, match", [
    (["chr1 2 a C A . . ."], "##fileformat=VCFv4.2\n", "line 2 is a record before the #CHROM header"),
    (["chr1 5 a A C . . .", "chr1 2 b C A . . ."], HEADER,
     r"not sorted: line 4 \(chr1:2\) comes after chr1:5; sort it first \(bcftools sort\)"),
    (["chr1 5 a A C . . .", "chr2 1 b G A . . .", "1 9 c A C . . ."], HEADER,
     r"line 5 \(1:9\) comes after other contigs, yet 1 came"),
    (["chr1 x a A C . . ."], HEADER, "line 3 is not a VCF record"),
])
def test_bad_vcf_is_one_line(tmp_path, records, header, match):
    with pytest.raises(GenomeLMError, match=match):
        read_vcf(vcf(tmp_path, records, header))


def test_truncated_gzip_is_one_line(tmp_path):
    path = vcf(tmp_path, [f"chr1 {p} a A C . . ." for p in range(1, 2000)], name="v.vcf.gz")
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(GenomeLMError, match="gzip stream is cut short or corrupt"):
        read_vcf(path)


def brute_force(pred, y):
    """AUROC by counting every (positive, negative) pair; AUPRC by thresholding at each distinct value."""
    pos, neg = pred[y == 1], pred[y == 0]
    auroc = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)])
    ap, last_recall = 0.0, 0.0
    for t in sorted(set(pred), reverse=True):
        called = pred >= t
        recall = (called & (y == 1)).sum() / len(pos)
        ap += (recall - last_recall) * (called & (y == 1)).sum() / called.sum()
        last_recall = recall
    return auroc, ap


def test_auroc_and_auprc_equal_a_brute_force_count_with_ties():
    rng = np.random.default_rng(0)
    for n in (5, 40):
        pred = rng.integers(0, 6, n).astype(float)  # many ties
        y = rng.integers(0, 2, n)
        y[:2] = [0, 1]
        got = auroc_auprc(pred, y)
        np.testing.assert_allclose([got[0][0], got[1][0]], brute_force(pred, y), rtol=1e-12)
        w = rng.integers(0, 3, (1, n)).astype(float)  # a bootstrap draw = variants repeated
        rep = np.repeat(np.arange(n), w[0].astype(int))
        np.testing.assert_allclose(np.ravel(auroc_auprc(pred, y, w)), brute_force(pred[rep], y[rep]), rtol=1e-12)


def test_metrics_by_context_with_cis_and_the_paired_difference():
    rng = np.random.default_rng(1)
    y = np.r_[np.ones(30), np.zeros(30)]
    scores = {100: rng.normal(size=60), 1000: rng.normal(size=60) - 2 * y}  # long context separates
    m = metrics(scores, y, "+", resamples=300)
    short, long_ = m["by_context"]
    assert 0.3 < short["auroc"] < 0.7 and long_["auroc"] > 0.85
    assert long_["auroc_ci"][0] < long_["auroc"] < long_["auroc_ci"][1]
    d = m["paired_vs_shortest"][1]
    assert d["d_auroc"] == pytest.approx(long_["auroc"] - short["auroc"]) and d["d_auroc_ci"][0] > 0
    assert m["paired_vs_shortest"][0]["d_auroc"] == 0
    assert m["roc"][1]["fpr"][0] == 0 and m["roc"][1]["tpr"][-1] == 1 and len(m["roc"][1]["fpr"]) <= 200
    assert m["score_shift"][1]["mean_score_pos"] < m["score_shift"][1]["mean_score_neg"]
