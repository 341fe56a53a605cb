"""`genome-lm variants` end to end on a tiny model directory: variants.parquet and summary.json as SCORE
contracts them, and the refusals in one line."""

import json

import numpy as np
import pandas as pd
import pytest

from genome_lm.cli import EXIT_USER_ERROR, main

SEQ = "".join("ACGT"[i] for i in np.random.default_rng(2).integers(0, 4, 400))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from genome_lm.model import save_pretrained
    from tests.helpers import tiny_model

    root = tmp_path_factory.mktemp("variants")
    save_pretrained(tiny_model(0), root / "model")
    (root / "ref.fa").write_text(f">chr1\n{SEQ}\n")
    (root / "v.vcf").write_text(
        "##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
        f"1\t3\ta\t{SEQ[2]}\t{'C' if SEQ[2] != 'C' else 'G'}\t.\t.\tCLNSIG=Pathogenic\n"  # near the contig start
        f"1\t200\tb\t{SEQ[199]}\t{'A' if SEQ[199] != 'A' else 'T'},<DEL>\t.\t.\tCLNSIG=Benign\n"
        f"1\t250\tc\t{SEQ[249:252]}\t{SEQ[249]}\t.\t.\tCLNSIG=Likely_pathogenic\n"
        f"1\t300\td\t{'A' if SEQ[299] != 'A' else 'C'}\tG\t.\t.\tCLNSIG=Benign\n")  # REF differs from the FASTA
    return root


def run(root, *extra):
    return main(["variants", "--checkpoint", str(root / "model"), "--fasta", str(root / "ref.fa"), "--vcf",
                 str(root / "v.vcf"), *extra])


def test_variants_writes_rows_by_context_and_strand_and_metrics(inputs, capsys):
    out = inputs / "out"
    assert run(inputs, "--contexts", "64", "--strands", "both", "--after", "2", "--labels", "CLNSIG",
               "--resamples", "50", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert "variants: 3 of 5 scored (skipped: 1 ref mismatch, 1 symbolic allele)" in printed and "AUROC" in printed
    df = pd.read_parquet(out / "variants.parquet")
    assert len(df) == 3 * 3 and set(df.strand) == {"+", "-", "both"}
    plus, minus, both = (df[df.strand == s].set_index("id") for s in ("+", "-", "both"))
    assert plus.loc["a", "context_used"] == 2 and minus.loc["a", "context_used"] == 64
    assert plus.loc["c", "kind"] == "del" and len(plus.loc["c", "ref_per_base"]) == 3 + 2
    np.testing.assert_allclose(both.score, (plus.score + minus.score) / 2)
    np.testing.assert_allclose(plus.score, plus.alt_logp - plus.ref_logp)
    assert list(plus.label) == [1.0, 0.0, 1.0]
    s = json.loads((out / "summary.json").read_text())
    assert s["variants"]["skipped"] == {"ref_mismatch": 1, "not_in_reference": 0, "symbolic_allele": 1}
    assert s["variants"]["ref_mismatches"][0].startswith("1:300 ") and s["strands"] == ["+", "-", "both"]
    m = s["metrics"]
    assert m["strand"] == "both" and m["by_context"][0]["n_pos"] == 2 and len(m["roc"][0]["fpr"]) >= 2


@pytest.mark.parametrize("extra, message", [
    (["--contexts", "1k"], "--contexts 1024 is not shorter than every contig holding a variant"),
    (["--contexts", "8", "--labels", "X", "--labels-tsv", "t.tsv"], "give --labels KEY or --labels-tsv TSV, not both"),
])
def test_refusals_are_one_line(inputs, capsys, extra, message):
    assert run(inputs, *extra, "--out", str(inputs / "refused")) == EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not (inputs / "refused").exists()
