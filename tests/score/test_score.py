"""`genome-lm score` end to end on glm53-tiny: the files and their layout (strands in forward coordinates,
N bases, embeddings per base and pooled, summary.json), resume after a kill, and the bad inputs, each one
line."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from genome_lm.cli import main
from genome_lm.genome.tokenizer import reverse_complement
from genome_lm.score.params import ScoreParams
from genome_lm.score.run import score
from tests.helpers import assert_close

REGIONS = [("chr1", 100, 400, "first"), ("2", 0, 200, None), ("chr1", 2900, 3004, "with_n")]  # 2 as chr2's alias


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> SimpleNamespace:
    from genome_lm.model import save_pretrained
    from tests.helpers import tiny_model

    torch.set_num_threads(1)  # tiny tensors: threads cost more than they give
    root = tmp_path_factory.mktemp("score")
    save_pretrained(tiny_model(0, initializer_range=0.1), root / "ckpt")
    rng = np.random.default_rng(0)
    seqs = {"chr1": "".join(rng.choice(list("ACGT"), 3000)) + "NNNN", "chr2": "".join(rng.choice(list("ACGT"), 1500)),
            "chrUn": "N" * 80}
    (root / "ref.fa").write_text("".join(f">{name}\n{seq}\n" for name, seq in seqs.items()))
    bed = root / "r.bed"
    bed.write_text("# regions\n" + "".join("\t".join(str(x) for x in r if x is not None) + "\n" for r in REGIONS))
    return SimpleNamespace(root=root, ckpt=root / "ckpt", fasta=root / "ref.fa", bed=bed, seqs=seqs)


def params(inputs, out, **kw) -> ScoreParams:
    return ScoreParams(checkpoint=str(inputs.ckpt), fasta=str(inputs.fasta), regions=str(inputs.bed), out=str(out),
                       chunk=256, **kw)


@pytest.fixture(scope="module")
def scored(inputs) -> Path:
    """The CLI with both strands and per-base embeddings of layers 0 and 5."""
    out = inputs.root / "out"
    assert main(["score", "--checkpoint", str(inputs.ckpt), "--fasta", str(inputs.fasta), "--regions",
                 str(inputs.bed), "--strands", "both", "--embeddings", "0,5", "--chunk", "256", "--out", str(out)]) == 0
    return out


def test_rows_strands_and_n_bases(inputs, scored):
    t = pq.read_table(scored / "logp").to_pandas()
    assert list(t.columns) == ["region", "chrom", "pos", "strand", "logp", "logp_a", "logp_c", "logp_g", "logp_t"]
    assert len(t) == 2 * (300 + 200 + 104)
    assert pq.ParquetFile(scored / "logp" / "r000000.parquet").num_row_groups == 2 * 2  # a row group per chunk
    first = t[t.region == "first"]
    fwd, rev = first[first.strand == "+"], first[first.strand == "-"]
    assert fwd.pos.tolist() == list(range(100, 400)) and rev.pos.tolist() == list(range(399, 99, -1))
    assert np.isnan(fwd.logp.iloc[0]) and np.isnan(rev.logp.iloc[0])  # the first base of each strand
    assert set(t[t.chrom == "chr2"].region) == {"chr2:0-200"}  # no name column: chrom:start-end
    with_n = t[(t.region == "with_n") & (t.strand == "+")]
    assert np.isnan(with_n.logp.iloc[-4:]).all() and not np.isnan(with_n.logp_a.iloc[-4:]).any()
    # the reverse strand is the reverse complement, scored from its own start (position 399)
    from genome_lm.model import build
    from genome_lm.score.engine import stream

    model = build(str(inputs.ckpt)).model.eval()
    tokens = np.frombuffer(inputs.seqs["chr1"][100:400].encode(), np.uint8)
    ids = torch.from_numpy(reverse_complement(np.searchsorted(np.frombuffer(b"ACGT", np.uint8), tokens))).long()
    want = torch.cat([c.logp_acgt for c in stream(model, ids, torch.arange(4), 300)])[1:]
    got = rev[["logp_a", "logp_c", "logp_g", "logp_t"]].to_numpy(copy=True)[1:]
    assert_close("reverse strand log p(A, C, G, T)", got, want, 1e-4)


def test_embeddings_and_summary(scored):
    regions = pq.read_table(scored / "regions.parquet").to_pylist()
    assert [(r["region"], r["row"], r["rows"]) for r in regions] == [("first", 0, 300), ("chr2:0-200", 300, 200),
                                                                     ("with_n", 500, 104)]
    emb = np.load(scored / "embeddings" / "layer5.reverse.npy", mmap_mode="r")
    assert emb.dtype == np.float16 and emb.shape == (604, 64) and np.isfinite(emb).all() and emb.std() > 0
    assert sorted(p.name for p in (scored / "embeddings").iterdir()) == [
        "layer0.forward.npy", "layer0.reverse.npy", "layer5.forward.npy", "layer5.reverse.npy"]
    s = json.loads((scored / "summary.json").read_text())
    assert (s["command"], s["regions"], s["bases"], s["strands"]) == ("score", 3, 604, ["+", "-"])
    assert s["embeddings"] == {"layers": [0, 5], "pool": "none", "dtype": "float16"}
    assert (s["chunk_tokens"], s["dtype"], s["trained_context"], s["longer_than_trained"]) == (256, "float32", None, [])
    assert len(s["reference"]["sha256"]) == 64 and s["checkpoint"]["weights_sha256"]


@pytest.mark.parametrize("pool, rows", [("mean", [1, 1, 1]), (128, [3, 2, 1])])
def test_pooled_embeddings_are_means_of_the_per_base_ones(inputs, scored, tmp_path, pool, rows):
    s = score(params(inputs, tmp_path / "p", strands="reverse", embeddings=[5], pool=pool), show_progress=False)
    assert s["embeddings"]["pool"] == pool
    got = np.load(tmp_path / "p" / "embeddings" / "layer5.reverse.npy").astype(np.float64)
    per_base = np.load(scored / "embeddings" / "layer5.reverse.npy").astype(np.float64)
    assert got.shape == (sum(rows), 64)
    stride = 10**9 if pool == "mean" else pool
    want = [per_base[a:b][i:i + stride].mean(0) for a, b in ((0, 300), (300, 500), (500, 604)) for i in
            range(0, b - a, stride)]
    np.testing.assert_allclose(got, np.array(want), atol=2e-3)  # float16 rows of float16 rows


def _killed_after_one_region(p: ScoreParams) -> None:
    from genome_lm.parallel import callbacks
    from tests.faults import KillAt

    torch.set_num_threads(1)
    callbacks.install(KillAt(step=1, rank=0))
    score(p, show_progress=False)


def test_killed_score_resumes_region_by_region(inputs, scored, tmp_path, caplog):
    from genome_lm.score.run import work_dir_for

    out = tmp_path / "k"
    p = params(inputs, out, strands="both", embeddings=[0, 5])
    proc = mp.get_context("spawn").Process(target=_killed_after_one_region, args=(p,))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -9 and not out.exists()
    work = work_dir_for(out)
    kept = work / "logp" / "r000000.parquet"
    assert sorted(x.name for x in (work / "done").iterdir()) == ["000000"] and kept.is_file()
    assert main(["score", "--checkpoint", str(inputs.ckpt), "--fasta", str(inputs.fasta), "--regions",
                 str(inputs.bed), "--chunk", "512", "--out", str(out)]) == 2  # other inputs: refused, work kept
    stamp = kept.stat().st_mtime_ns
    with caplog.at_level("INFO"):
        score(p, show_progress=False)
    assert "1 already done" in caplog.text and not work.exists()
    assert (out / "logp" / "r000000.parquet").stat().st_mtime_ns == stamp  # kept, not scored again
    for name in ("r000001.parquet", "r000002.parquet"):
        pd.testing.assert_frame_equal(*(pq.read_table(d / "logp" / name).to_pandas() for d in (out, scored)))
    for name in ("layer0.forward.npy", "layer5.reverse.npy"):
        np.testing.assert_array_equal(*(np.load(d / "embeddings" / name) for d in (out, scored)))


@pytest.mark.parametrize("bed, extra, message", [
    ("chr1\t100\t3010\n", [], r"line 1: chr1:100-3010 ends beyond chr1 \(3,004 bases"),
    ("chrUn\t0\t50\tgap\n", [], r"region gap \(chrUn:0-50\) is all N"),
    ("chr7\t0\t50\n", [], r"has no contig chr7 \(it has chr1, chr2, chrUn\)"),
    ("chr1\t50\t50\n", [], r"line 1: start 50, end 50 is no region"),
    ("chr1 ten 50\n", [], r"line 1: expected chrom, start, end\[, name\]"),
    ("# nothing\n", [], r"holds no region"),
    ("chr1\t0\t50\n", ["--embeddings", "6"], r"--embeddings 6: the model has decoder layers 0 to 5"),
    ("chr1\t0\t50\n", ["--chunk", "100"], r"100 is not a multiple of 64 \(the KDA chunk\).*use 64"),
    ("chr1\t0\t50\n", ["--device", "gpu"], r"--device: String should match pattern"),
    ("chr1\t0\t50\n", ["--pool", "0"], r"--pool: use none, mean or a stride in bases .* not '0'"),
    (None, [], r"region chrUn \(chrUn:0-80\) is all N"),  # no --regions: every contig
])
def test_bad_input_is_one_line(inputs, tmp_path, capsys, bed, extra, message):
    if bed is not None:
        (tmp_path / "bad.bed").write_text(bed)
        extra = ["--regions", str(tmp_path / "bad.bed"), *extra]
    out = tmp_path / "o"
    code = main(["score", "--checkpoint", str(inputs.ckpt), "--fasta", str(inputs.fasta), "--out", str(out), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("genome-lm score: error: ") or "argument" in err
    import re

    assert re.search(message, err), err
    assert not out.exists()


def _score_on_ranks(rank: int, world: int, p: dict) -> None:
    score(ScoreParams(**p), show_progress=False)


@pytest.mark.slow  # 20-50 s: two spawned processes import torch and build the model
def test_two_processes_with_cp_2_equal_one_process(inputs, scored, tmp_path):
    """`--nproc 2 --cp 2` (FSDP2 + each region in one forward split over 2 gloo processes) against the one
    process of `scored` (streamed): the same rows, log-probs and embeddings within 1e-4."""
    from tests.helpers import spawn

    out = tmp_path / "cp2"
    spawn(_score_on_ranks, 2, params(inputs, out, strands="both", embeddings=[0, 5], cp=2).model_dump(mode="json"),
          timeout=240)
    got, want = (pq.read_table(d / "logp").to_pandas() for d in (out, scored))
    pd.testing.assert_frame_equal(got[["region", "chrom", "pos", "strand"]], want[["region", "chrom", "pos", "strand"]])
    for col in ("logp", "logp_a", "logp_c", "logp_g", "logp_t"):
        np.testing.assert_array_equal(np.isnan(got[col]), np.isnan(want[col]))
        ok = ~np.isnan(want[col].to_numpy())
        assert_close(col, got[col].to_numpy()[ok], want[col].to_numpy()[ok], 1e-4)
    for name in ("layer0.forward.npy", "layer5.reverse.npy"):
        a, b = (np.load(d / "embeddings" / name).astype(np.float32) for d in (out, scored))
        assert_close(name, a, b, 2e-3)  # float16 rows: one rounding step


def test_regions_longer_than_the_trained_context_are_named(inputs, tmp_path, capsys):
    import shutil

    last = tmp_path / "run" / "checkpoints" / "last"
    shutil.copytree(inputs.ckpt, last / "model")
    (tmp_path / "run" / "config.yaml").write_text("data:\n  seq_len: 256\n")
    (tmp_path / "two.bed").write_text("chr1\t100\t400\tfirst\nchr2\t0\t200\n")
    out = tmp_path / "o"
    assert main(["score", "--checkpoint", str(last), "--fasta", str(inputs.fasta), "--regions",
                 str(tmp_path / "two.bed"), "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert (s["trained_context"], s["longer_than_trained"]) == (256, ["first"])
    assert capsys.readouterr().out.strip().endswith("longer than the trained context (256): first")


class _StopAfter:
    def __call__(self, step: int, rank: int, attempt: int) -> None:
        raise KeyboardInterrupt


def test_interrupted_score_says_what_it_keeps(inputs, tmp_path, capsys, step_callbacks):
    step_callbacks(_StopAfter())
    out = tmp_path / "i"
    assert main(["score", "--checkpoint", str(inputs.ckpt), "--fasta", str(inputs.fasta), "--regions",
                 str(inputs.bed), "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().endswith(
        f"interrupted; the 1 region(s) scored so far are kept in {tmp_path / '.i.score-work'}, and the same score "
        "command resumes from them")


def test_without_regions_every_contig_is_one(inputs, tmp_path):
    (tmp_path / "two.fa").write_text(f">chrA\n{inputs.seqs['chr1'][:100]}\n>chrB\n{inputs.seqs['chr2'][:60]}\n")
    p = ScoreParams(checkpoint=str(inputs.ckpt), fasta=str(tmp_path / "two.fa"), out=str(tmp_path / "o"))
    assert score(p, show_progress=False)["bases"] == 160
    t = pq.read_table(tmp_path / "o" / "logp").to_pandas()
    assert t.groupby("region").pos.agg(["min", "max"]).to_dict("index") == {"chrA": {"min": 0, "max": 99},
                                                                            "chrB": {"min": 0, "max": 59}}
