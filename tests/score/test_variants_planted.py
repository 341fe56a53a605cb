"""Planted variants whose effect depends on distant context (benchmarks/planted_variants.py), and the
acceptance: `variants` ranks them as the planted truth says at long context, with a model that copies.

The copying model is glm53-demo trained on the copy task of benchmarks/probe_copy_learning.py (the
second half of 128 bases repeats the first); each planted SNV sits late in the second half of a contig
that is such a copy (label 1) or fresh bases (label 0). At context 128 the source is in view, at 32 it
is not."""

import json

import numpy as np
import pytest

from genome_lm.cli import main
from genome_lm.genome.fasta import Reference
from genome_lm.score.vcf import check_against, read_vcf
from tests.helpers import load_benchmark

planted = load_benchmark("planted_variants")
COPY_STEPS = 3000  # copied-half loss about 1.0 at 1,500 steps, 0.63 at 3,000 (ln 4 = 1.39 without copying)


def test_copy_contigs_plant_one_variant_per_contig_labelled_by_the_copy(tmp_path):
    fasta, vcf = planted.copy_contigs(10, half=32, seed=1)
    (tmp_path / "c.fa").write_text(fasta)
    (tmp_path / "c.vcf").write_text(vcf)
    variants, _ = read_vcf(tmp_path / "c.vcf", labels="LABEL")
    ref = Reference.load(tmp_path / "c.fa", [v.chrom for v in variants])
    kept, skipped, _ = check_against(variants, ref)
    assert len(kept) == 10 and skipped["ref_mismatch"] == 0
    for v in kept:
        seq = ref.tokens(v.chrom)
        assert 48 <= v.start < 64 and (seq[v.start] == seq[v.start - 32]) == (v.label == 1)
        assert (seq[32:64] == seq[:32]).all() == (v.label == 1)


def test_repeat_variants_lie_in_copies_with_an_earlier_source_or_outside_all(tmp_path):
    from genome_lm.genome.synth import write_synthetic_fasta

    written = write_synthetic_fasta(tmp_path / "g.fa.gz", scale=0.02, seed=4)
    tsv = written.repeats
    (tmp_path / "v.vcf").write_text(planted.repeat_variants(tmp_path / "g.fa.gz", tsv, "chr22", 15, seed=2))
    variants, _ = read_vcf(tmp_path / "v.vcf", labels="LABEL")
    kept, skipped, _ = check_against(variants, Reference.load(tmp_path / "g.fa.gz", ["chr22"]))
    assert skipped["ref_mismatch"] == 0 and {v.label for v in kept} == {0.0, 1.0}
    rows = [r.split("\t") for r in tsv.read_text().splitlines()[1:] if r.startswith("chr22\t")]
    for v in kept:
        holders = [r for r in rows if int(r[1]) <= v.start < int(r[2])]
        assert (v.label == 1) == any(0 <= int(r[5]) < int(r[1]) for r in holders) and (v.label == 1 or not holders)


@pytest.fixture(scope="session")
def copying_model(tmp_path_factory):
    """glm53-demo taught the copy task (the probe's loop: AdamW lr 2e-3, batches of 8 x 128)."""
    import torch

    from genome_lm.model import apply_long_context, build, save_pretrained

    probe = load_benchmark("probe_copy_learning")
    torch.manual_seed(0)
    model = apply_long_context(build("glm53-demo", dtype="float32").model)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.05)
    for _ in range(COPY_STEPS):
        x, _ = probe.copy_batch(8, 128, False)
        model(x, labels=x).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return save_pretrained(model, tmp_path_factory.mktemp("copier") / "model")


@pytest.mark.slow
def test_planted_variants_rank_by_the_truth_only_when_the_context_reaches_the_source(copying_model, tmp_path):
    fasta, vcf = planted.copy_contigs(200, half=64, seed=0)
    (tmp_path / "c.fa").write_text(fasta)
    (tmp_path / "c.vcf").write_text(vcf)
    assert main(["variants", "--checkpoint", str(copying_model), "--fasta", str(tmp_path / "c.fa"), "--vcf",
                 str(tmp_path / "c.vcf"), "--labels", "LABEL", "--contexts", "32,128", "--resamples", "500",
                 "--out", str(tmp_path / "out")]) == 0
    metrics = json.loads((tmp_path / "out" / "summary.json").read_text())["metrics"]
    short, long_ = metrics["by_context"]
    gain = metrics["paired_vs_shortest"][1]
    assert long_["auroc_ci"][0] > 0.6  # the source in view: variants that break a copy rank first
    assert gain["context"] == 128 and gain["d_auroc_ci"][0] > 0  # and better than without it
    assert np.isfinite(short["auroc"]) and short["auroc"] < 0.65  # the source out of view: near chance
