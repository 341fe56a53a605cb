"""`genome-lm prepare`: every window against an independent reference cut of the source FASTA."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.genome import decode, load_manifest, load_shards
from genome_lm.genome.prepare import PrepareParams, prepare
from genome_lm.genome.tokenizer import unpack_mask

from .conftest import write_fasta

IUPAC_TO_N = str.maketrans("RYSWKMBDHVryswkmbdhv", "N" * 20)
COMP = str.maketrans("ACGTN", "TGCAN")


def expected_windows(seq: str, seq_len: int, stride: int, min_gap: int, max_n_frac: float, tail: str, min_len: int):
    """Reference cut of one chromosome, written independently of genome_lm.genome.prepare."""
    bases = seq.translate(IUPAC_TO_N).upper()
    gaps = [m.span() for m in re.finditer("N+", bases) if m.end() - m.start() >= min_gap]
    bounds, pos = [], 0
    for s, e in gaps:
        if s > pos:
            bounds.append((pos, s))
        pos = e
    if pos < len(bases):
        bounds.append((pos, len(bases)))
    out = []
    for c0, c1 in bounds:
        starts = list(range(c0, c1 - seq_len + 1, stride))
        spans = [(s, s + seq_len) for s in starts]
        nxt = starts[-1] + stride if starts else c0
        covered = spans[-1][1] if spans else c0
        if tail == "keep" and nxt < c1 and covered < c1 and c1 - nxt >= min_len:
            spans.append((nxt, c1))
        for s, e in spans:
            if bases[s:e].count("N") / (e - s) <= max_n_frac:
                out.append((s, e))
    return out


def run_prepare(fastas, out, **kw) -> dict:
    args = dict(train_chroms="chr1,chr2", eval_chroms="chr22", seq_len=512, stride=None, min_gap=100,
                max_n_frac=0.05, tail="keep", min_len=64, reverse_complement=False, format="hf")
    overwrite = kw.pop("overwrite", False)
    args.update(kw)
    params = PrepareParams.from_cli(fasta=[str(f) for f in fastas], **args)
    return prepare(params, out, overwrite=overwrite, show_progress=False)


def check_against_source(out: Path, genome: dict[str, str], **cut):
    manifest = load_manifest(out)
    for split in manifest["splits"]:
        ds = load_shards(out, split)
        rows = [(r["chrom"], int(r["start"]), int(r["end"]), r["strand"]) for r in ds]
        expect = []
        for chrom in manifest["splits"][split]["chroms"]:
            fwd = expected_windows(genome[chrom], **cut)
            expect += [(chrom, s, e, "+") for s, e in fwd]
            if manifest["parameters"]["reverse_complement"] and split == "train":
                expect += [(chrom, s, e, "-") for s, e in fwd]
        assert rows == expect, split
        for r in ds:  # every token and mask bit against the source
            src = genome[r["chrom"]][r["start"] : r["end"]]
            bases = src.translate(IUPAC_TO_N).upper()
            lower = np.array([c.islower() for c in src])
            tokens = r["tokens"]
            assert tokens.dtype == np.uint8
            mask = unpack_mask(r["repeat_mask"], len(tokens))
            if r["strand"] == "+":
                assert decode(tokens) == bases
                assert np.array_equal(mask, lower)
            else:
                assert decode(tokens) == bases.translate(COMP)[::-1]
                assert np.array_equal(mask, lower[::-1])
            assert r["n_frac"] == pytest.approx(bases.count("N") / len(bases), abs=1e-6)
    return manifest


CUT = dict(seq_len=512, stride=512, min_gap=100, max_n_frac=0.05, tail="keep", min_len=64)


@pytest.mark.parametrize("width,crlf,compression", [(60, False, "none"), (7, True, "none"), (80, False, "gzip"),
                                                    (61, True, "bgzip"), (10_000, False, "none")])
def test_every_window_matches_source(tmp_path, genome, width, crlf, compression):
    fa = write_fasta(tmp_path / "g.fa", genome, width=width, crlf=crlf, compression=compression)
    manifest = run_prepare([fa], tmp_path / "out")
    check_against_source(tmp_path / "out", genome, **CUT)
    assert manifest["vocab"] == {"A": 0, "C": 1, "G": 2, "T": 3, "N": 4}
    chr1 = manifest["splits"]["train"]["per_chrom"]["chr1"]
    assert chr1["length"] == 5000
    assert chr1["n_bases"] == genome["chr1"].translate(IUPAC_TO_N).upper().count("N")
    assert sum(chr1["iupac"].values()) == sum(genome["chr1"].upper().count(c) for c in "RYSWKMBDHV")
    assert chr1["softmasked_bases"] == sum(c.islower() for c in genome["chr1"])


@pytest.mark.parametrize("cut", [
    dict(seq_len=300, stride=300, min_gap=5, max_n_frac=0.0, tail="keep", min_len=1),
    dict(seq_len=400, stride=150, min_gap=100, max_n_frac=0.05, tail="keep", min_len=50),
    dict(seq_len=400, stride=500, min_gap=1000, max_n_frac=0.5, tail="drop", min_len=400),
    dict(seq_len=1000, stride=1000, min_gap=100, max_n_frac=1.0, tail="drop", min_len=1000),
])
def test_gap_tail_stride_rules(tmp_path, genome, cut):
    fa = write_fasta(tmp_path / "g.fa", genome)
    run_prepare([fa], tmp_path / "out", **cut)
    check_against_source(tmp_path / "out", genome, **cut)


def test_reverse_complement_only_in_train(tmp_path, genome):
    fa = write_fasta(tmp_path / "g.fa", genome)
    manifest = run_prepare([fa], tmp_path / "out", reverse_complement=True)
    check_against_source(tmp_path / "out", genome, **CUT)
    assert set(load_shards(tmp_path / "out", "eval")["strand"]) == {"+"}
    train = manifest["splits"]["train"]["per_chrom"]["chr1"]
    assert train["rc_windows"] == train["windows"] > 0


def test_dropped_counts(tmp_path, genome):
    fa = write_fasta(tmp_path / "g.fa", genome)
    manifest = run_prepare([fa], tmp_path / "out", **CUT)
    chr1 = manifest["splits"]["train"]["per_chrom"]["chr1"]
    assert chr1["dropped_bases"]["gap"] == 120 + 300  # the trailing 10 N are shorter than min_gap
    assert chr1["contigs"] == 2
    kept = expected_windows(genome["chr1"], **CUT)
    assert chr1["windows"] == len(kept)
    assert chr1["tokens"] == sum(e - s for s, e in kept)


def test_several_files_and_chr_prefix_matching(tmp_path, genome):
    a = write_fasta(tmp_path / "a.fa", {"1": genome["chr1"], "chr2": genome["chr2"]})
    b = write_fasta(tmp_path / "b.fa.gz", {"22": genome["chr22"]}, compression="gzip")
    manifest = run_prepare([a, b], tmp_path / "out", train_chroms="chr1,2", eval_chroms="chr22")
    assert manifest["splits"]["train"]["chroms"] == ["1", "chr2"]
    assert manifest["splits"]["eval"]["chroms"] == ["22"]
    assert [i["path"] for i in manifest["inputs"]] == [str(a.resolve()), str(b.resolve())]
    renamed = {"1": genome["chr1"], "chr2": genome["chr2"], "22": genome["chr22"]}
    check_against_source(tmp_path / "out", renamed, **CUT)


def test_indexed_and_streamed_reads_give_identical_shards(tmp_path, genome):
    import pyfaidx

    plain = write_fasta(tmp_path / "g.fa", genome, width=70)
    run_prepare([plain], tmp_path / "streamed")
    pyfaidx.Faidx(str(plain)).close()  # writes g.fa.fai
    bgz = write_fasta(tmp_path / "g.fa.gz", genome, width=70, compression="bgzip")
    pyfaidx.Faidx(str(bgz)).close()  # writes .fai and .gzi
    from genome_lm.genome.fasta import FastaReader

    assert FastaReader(plain).info.records == FastaReader(bgz).info.records == ["chr1", "chr2", "chr22"]  # index in use
    run_prepare([plain], tmp_path / "indexed")
    run_prepare([bgz], tmp_path / "bgzip")
    for other in ("indexed", "bgzip"):
        for split in ("train", "eval"):
            for f in sorted((tmp_path / "streamed" / split).glob("*.arrow")):
                assert f.read_bytes() == (tmp_path / other / split / f.name).read_bytes(), (other, f.name)


def test_same_input_same_bytes(tmp_path, genome):
    fa = write_fasta(tmp_path / "g.fa.gz", genome, compression="gzip")
    m1 = run_prepare([fa], tmp_path / "a", reverse_complement=True)
    m2 = run_prepare([fa], tmp_path / "b", reverse_complement=True)
    for split in ("train", "eval"):
        files = sorted(p.name for p in (tmp_path / "a" / split).iterdir())
        assert files == sorted(p.name for p in (tmp_path / "b" / split).iterdir())
        for name in files:
            assert (tmp_path / "a" / split / name).read_bytes() == (tmp_path / "b" / split / name).read_bytes()
    for m in (m1, m2):
        m.pop("created_at"), m.pop("checksum")  # the checksum covers the time of writing
    assert m1 == m2


def test_rerun_is_a_no_op_and_overwrite_rebuilds(tmp_path, genome, caplog):
    fa = write_fasta(tmp_path / "g.fa", genome)
    out = tmp_path / "out"
    run_prepare([fa], out)
    before = (out / "manifest.json").stat().st_mtime_ns
    with caplog.at_level("INFO", logger="genome_lm.genome.prepare"):
        run_prepare([fa], out)
    assert "already complete" in caplog.text
    assert (out / "manifest.json").stat().st_mtime_ns == before
    with pytest.raises(GenomeLMError, match="other inputs or parameters; pass --overwrite"):
        run_prepare([fa], out, seq_len=256)
    run_prepare([fa], out, seq_len=256, overwrite=True)
    assert load_manifest(out)["parameters"]["seq_len"] == 256
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("damage", ["truncate", "remove_split", "edit_manifest", "garble_manifest"])
def test_damaged_shards_are_not_complete_and_reading_them_is_one_line(tmp_path, genome, caplog, damage):
    """A rerun over a truncated .arrow, a deleted split or an edited manifest is not "already
    complete"; loading such shards is one line naming the file and the rebuild."""
    caplog.set_level("INFO", logger="genome_lm.genome.prepare")
    fa = write_fasta(tmp_path / "g.fa", genome)
    out = tmp_path / "out"
    run_prepare([fa], out)
    arrow = sorted((out / "eval").glob("*.arrow"))[0]
    manifest = out / "manifest.json"
    if damage == "truncate":
        arrow.write_bytes(arrow.read_bytes()[:-100])
        expected = f"eval/{arrow.name} has {arrow.stat().st_size:,} bytes, the manifest records"
    elif damage == "remove_split":
        shutil.rmtree(out / "eval")
        expected = f"eval/{arrow.name} is missing"
    elif damage == "edit_manifest":
        manifest.write_text(manifest.read_text().replace('"windows": ', '"windows": 1', 1))
        expected = "was changed after prepare wrote it"
    else:
        manifest.write_text(manifest.read_text()[:50])
        expected = "is damaged (not JSON"
    with pytest.raises(GenomeLMError, match=re.escape(expected)) as err:
        run_prepare([fa], out)
    assert "--overwrite" in str(err.value) and "\n" not in str(err.value)
    assert "already complete" not in caplog.text
    with pytest.raises(GenomeLMError, match=re.escape(expected)):
        load_shards(out, "eval")
    run_prepare([fa], out, overwrite=True)
    assert len(load_shards(out, "eval")) > 0


def test_interrupted_run_leaves_nothing(tmp_path, genome, monkeypatch):
    import genome_lm.genome.prepare as prep

    fa = write_fasta(tmp_path / "g.fa", genome)
    calls = []
    real = prep._process_record

    def dies_on_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(prep, "_process_record", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        run_prepare([fa], tmp_path / "out")
    assert list(tmp_path.iterdir()) == [fa]


def test_load_shards_numpy_format(tmp_path, genome):
    fa = write_fasta(tmp_path / "g.fa", genome)
    run_prepare([fa], tmp_path / "out")
    ds = load_shards(tmp_path / "out", "eval")
    row = ds[0]
    assert isinstance(row["tokens"], np.ndarray) and row["tokens"].dtype == np.uint8
    assert row["chrom"] == "chr22" and row["strand"] == "+"
    with pytest.raises(GenomeLMError, match="unknown split"):
        load_shards(tmp_path / "out", "valid")


def test_hf_features_match_datasets_serialisation():
    import datasets

    from genome_lm.genome.shards import features

    feats = datasets.Features({
        "chrom": datasets.Value("string"), "start": datasets.Value("int64"), "end": datasets.Value("int64"),
        "strand": datasets.Value("string"), "tokens": datasets.List(datasets.Value("uint8")),
        "repeat_mask": datasets.List(datasets.Value("uint8")), "n_frac": datasets.Value("float32"),
    })
    assert feats.to_dict() == features()


def test_megatron_format(tmp_path, genome):
    pytest.importorskip("megatron.core")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    fa = write_fasta(tmp_path / "g.fa", genome)
    manifest = run_prepare([fa], tmp_path / "out", format="megatron", reverse_complement=True)
    assert manifest["megatron"] == {"train": "megatron/train", "eval": "megatron/eval"}
    for split in ("train", "eval"):
        mds = IndexedDataset(str(tmp_path / "out" / "megatron" / split))
        ds = load_shards(tmp_path / "out", split)
        assert len(mds) == len(ds)
        for i in range(len(ds)):
            assert np.array_equal(mds[i], ds[i]["tokens"])


# -- bad input: one line, exit 2, no traceback, nothing written --------------------------------

def _cli_fails(capsys, tmp_path, argv, match):
    out = tmp_path / "out"
    before = set(tmp_path.iterdir())
    code = main(["prepare", *argv, "--out", str(out)] if "--out" not in argv else ["prepare", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("genome-lm prepare: error:"), err
    assert re.search(match, err), err
    assert set(tmp_path.iterdir()) - before <= {p for p in (out,) if p in before}, "left output behind"
    return err


def test_bad_inputs(tmp_path, genome, capsys):
    good = write_fasta(tmp_path / "good.fa", genome)
    empty = tmp_path / "empty.fa"
    empty.write_bytes(b"")
    notfa = tmp_path / "notes.txt"
    notfa.write_text("hello world\nthis is not a genome\n")
    binary = tmp_path / "image.fa"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff binary")
    trunc = tmp_path / "trunc.fa.gz"
    full = write_fasta(tmp_path / "full.fa.gz", genome, compression="gzip").read_bytes()
    trunc.write_bytes(full[: len(full) // 2])
    dup = write_fasta(tmp_path / "dup.fa", {"chr1": "ACGT"})
    dup.write_text(dup.read_text() + ">chr1 again\nACGT\n")
    bad = write_fasta(tmp_path / "bad.fa", {"chr1": "ACGTACGT" * 10 + "AC-GT", "chr2": "A", "chr22": "C"})
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        (["--fasta", str(empty)], "is empty"),
        (["--fasta", str(notfa)], "not a FASTA file: it starts with 'hello world"),
        (["--fasta", str(binary)], "not a FASTA file: it starts with binary data instead"),  # no raw bytes echoed
        (["--fasta", str(trunc)], "truncated"),
        (["--fasta", str(dup), "--train-chroms", "chr1", "--eval-chroms", ""], "duplicate record name 'chr1'"),
        (["--fasta", str(bad)], r"invalid character '-' at base offset 82"),
        (["--fasta", str(good), "--train-chroms", "chr1,chr3"], r"chromosome chr3 not found.*chr1, chr2, chr22"),
        (["--fasta", str(good), "--train-chroms", "chr1,22"], "in both --train-chroms and --eval-chroms"),
        (["--fasta", str(good), "--seq-len", "1M", "--min-len", "1M"], r"has no windows.*or --min-len$"),  # tail keep
        (["--fasta", str(good), "--seq-len", "1M", "--min-len", "1M", "--tail", "drop"], r"or use --tail keep$"),
        (["--fasta", str(good), "--seq-len", "12q"], "--seq-len"),
        (["--fasta", str(tmp_path / "missing.fa")], "does not exist"),
        (["--fasta", str(good), "--max-n-frac", "2"], "--max-n-frac"),
        (["--fasta", str(good), "--out", str(afile / "sub")], "cannot create output directory"),
    ]
    for argv, match in cases:
        _cli_fails(capsys, tmp_path, argv, match)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "thesis.tex").write_text("precious")
    _cli_fails(capsys, tmp_path, ["--fasta", str(good), "--out", str(occupied)], "not empty")
    assert (occupied / "thesis.tex").read_text() == "precious"


def test_cli_success(tmp_path, genome, capsys):
    fa = write_fasta(tmp_path / "g.fa", genome)
    code = main(["prepare", "--fasta", str(fa), "--seq-len", "512", "--min-gap", "100", "--out", str(tmp_path / "o")])
    assert code == 0
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["parameters"]["min_len"] == 64  # default: seq-len / 8
    assert manifest["splits"]["eval"]["windows"] > 0


def test_cli_config_file_flags_and_set(tmp_path, genome, capsys):
    fa = write_fasta(tmp_path / "g.fa", genome)
    cfg = tmp_path / "prepare.yaml"
    cfg.write_text(f"fasta: [{fa}]\nseq_len: 1k\nmin_gap: 100\ntrain_chroms: [chr1]\n")
    code = main(["prepare", "--config", str(cfg), "--seq-len", "512", "--set", "eval_chroms=chr2,chr22",
                 "--out", str(tmp_path / "o")])
    assert code == 0, capsys.readouterr().err
    params = json.loads((tmp_path / "o" / "manifest.json").read_text())["parameters"]
    assert params["seq_len"] == 512 and params["min_len"] == 64 and params["eval_chroms"] == ["chr2", "chr22"]
    cfg.write_text(f"fasta: [{fa}]\nseq_lenn: 1k\n")
    _cli_fails(capsys, tmp_path, ["--config", str(cfg)], r"prepare.yaml: unknown key seq_lenn; did you mean seq_len\?")


@pytest.mark.parametrize("case, chroms, expect", [
    ("empty record", {"chr2": ""}, "chr2 (train) gives no window: its FASTA record is empty (0 bp)"),
    ("all N", {"chr2": "N" * 900}, "chr2 (train) gives no window: all of its 900 bases are N"),
    ("too short", {"chr2": "ACGT" * 10}, "chr2 (train) gives no window: its longest contig, 40 bases, is shorter "
                                          "than --min-len 64"),
    ("no train chromosomes", {}, "--train-chroms is empty: the shards will hold no train split"),
])
def test_a_requested_chromosome_or_split_that_gives_nothing_warns(tmp_path, genome, caplog, case, chroms, expect):
    fa = write_fasta(tmp_path / "g.fa", {**genome, **chroms})
    kw = {"train_chroms": ""} if case == "no train chromosomes" else {}
    manifest = run_prepare([fa], tmp_path / "out", **kw)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(expect in w for w in warnings), warnings
    assert ("train" in manifest["splits"]) == (case != "no train chromosomes")


def test_shards_whose_arrow_file_does_not_parse_are_one_line(tmp_path, genome):
    """Bytes changed at the start of a split's .arrow file (its size as recorded) make it unreadable:
    loading the split says so in one line with the rebuild."""
    fa = write_fasta(tmp_path / "g.fa", genome)
    out = tmp_path / "out"
    run_prepare([fa], out)
    arrow = sorted((out / "eval").glob("*.arrow"))[0]
    data = bytearray(arrow.read_bytes())
    data[:64] = bytes(b ^ 0x5A for b in data[:64])
    arrow.write_bytes(bytes(data))
    with pytest.raises(GenomeLMError, match=rf"the shards in {re.escape(str(out))} are damaged: eval/ does not load "
                                            r"\(.+\); rebuild them with the same `genome-lm prepare`") as err:
        load_shards(out, "eval")
    assert "\n" not in str(err.value)


def test_a_folder_of_other_files_is_not_offered_overwrite(tmp_path, genome):
    fa = write_fasta(tmp_path / "g.fa", genome)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("x")
    with pytest.raises(GenomeLMError, match=r"holds no genome_lm shards \(--overwrite replaces only shards\): "
                                            r"choose another --out$"):
        run_prepare([fa], out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
