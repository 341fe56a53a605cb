"""The report's "Variant effect by context" section from a variants output folder (tests/report/conftest.py
writes one per its schema), and the folders the report refuses beside it."""

from __future__ import annotations

import json

import pytest

from genome_lm.errors import GenomeLMError
from genome_lm.report import build_report
from tests.report.conftest import write_variants_output


def test_variants_section_has_roc_shift_and_table(tmp_path):
    page = build_report([write_variants_output(tmp_path / "brca1")])
    assert "<h2>Variant effect by context</h2>" in page
    assert 'alt="ROC by context"' in page and 'alt="score shift vs context"' in page
    assert "100 of 103 variants scored (skipped: 3 ref mismatch)" in page
    assert "<td>65,536</td><td>40</td><td>60</td><td>0.800</td><td>[+0.750, +0.850]</td>" in page
    assert "<td>+0.200</td><td>[+0.160, +0.240]</td>" in page  # paired difference against 1k


def test_unlabelled_variants_get_counts_only(tmp_path):
    page = build_report([write_variants_output(tmp_path / "clinvar", labelled=False)])
    assert "No labels were given" in page and "ROC by context" not in page


def test_score_output_and_broken_variants_summary_are_refused(tmp_path):
    (tmp_path / "score").mkdir()
    (tmp_path / "score" / "summary.json").write_text(json.dumps({"command": "score", "regions": 1}))
    with pytest.raises(GenomeLMError, match="is a `genome-lm score` output"):
        build_report([tmp_path / "score"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text(json.dumps({"command": "variants", "contexts": [1024]}))
    with pytest.raises(GenomeLMError, match="is not a variants summary .*variants, metrics"):
        build_report([tmp_path / "bad"])
