import gzip

import pytest

from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import Reference


def test_contigs_load_by_any_alias_and_a_missing_one_is_named(tmp_path):
    path = tmp_path / "ref.fa.gz"
    with gzip.open(path, "wt") as f:
        f.write(">chr1 first\nACGTN\nacgt\n>chrM\nGG\n>2\nTT\n>chr3\nA\n")
    ref = Reference.load(path, ["1", "MT", "chr2"])
    assert ref.record("chr1") == "chr1" and ref.tokens("1").tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert ref.record("chrMT") == "chrM" and ref.record("chr2") == "2" and ref.tokens("chr2").tolist() == [3, 3]
    assert "chr3" not in [name for name, _ in ref.records.values()]  # only the named contigs are kept
    with pytest.raises(GenomeLMError, match="has no contig chr9 .*chr1, chrM, 2, chr3"):
        Reference.load(path, ["chr9"])
    with pytest.raises(GenomeLMError, match="contig chr3 was not loaded"):
        ref.tokens("chr3")
