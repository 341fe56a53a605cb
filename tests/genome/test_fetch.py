"""`genome-lm fetch` against a local HTTP server: fresh download, resume, servers that ignore
Range or cut responses short, checksum mismatch, missing chromosome, skip when present."""

from __future__ import annotations

import gzip
import hashlib
import logging
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.genome.fetch import add_chr_prefix, fetch_chromosomes, read_md5sums


def fasta_gz(name: str, n: int, seed: int) -> bytes:
    """A small, poorly compressible gzip FASTA record (tens of kB)."""
    seq = np.frombuffer(b"ACGT", np.uint8)[np.random.default_rng(seed).integers(0, 4, n)].tobytes()
    lines = b"\n".join(seq[i : i + 60] for i in range(0, n, 60))
    return gzip.compress(b">" + name.encode() + b"\n" + lines + b"\n", mtime=0)


FILES = {"chr1.fa.gz": fasta_gz("chr1", 120_000, 1), "chr22.fa.gz": fasta_gz("chr22", 60_000, 2)}


class FixtureServer:
    """Serves FILES and md5sum.txt under /hg38/, with Range support that tests can switch
    off (`ignore_range`) and responses that can be cut short (`cut_after` bytes, `cut_times`
    responses). `requests` records (file name, Range header or None) per GET."""

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.files["md5sum.txt"] = "".join(f"{hashlib.md5(d).hexdigest()}  {n}\n" for n, d in files.items()).encode()
        self.requests: list[tuple[str, str | None]] = []
        self.ignore_range = False
        self.cut_after, self.cut_times = 0, 0
        state = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                name = self.path.removeprefix("/hg38/")
                rng = self.headers.get("Range")
                state.requests.append((name, rng))
                data = state.files.get(name)
                if data is None:
                    self.send_error(404, "Not Found")
                    return
                start, status = 0, 200
                if rng and not state.ignore_range:
                    start, status = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1)), 206
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                body = data[start:]
                self.send_response(status)
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if state.cut_times > 0 and name != "md5sum.txt":
                    state.cut_times -= 1
                    body = body[: state.cut_after]  # the connection closes after this
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hg38"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def file_requests(self) -> list[tuple[str, str | None]]:
        return [r for r in self.requests if r[0] != "md5sum.txt"]


@pytest.fixture
def server():
    s = FixtureServer(FILES)
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def assert_only_final_files(out_dir, names):
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(names)
    for name in names:
        assert (out_dir / name).read_bytes() == FILES[name]


def test_add_chr_prefix():
    assert add_chr_prefix("22") == "chr22"
    assert add_chr_prefix(" chrX ") == "chrX"
    with pytest.raises(GenomeLMError, match="empty chromosome"):
        add_chr_prefix(" ")


def test_fresh_download_verifies(server, tmp_path):
    out = tmp_path / "hg38"
    paths = fetch_chromosomes(["chr1", "22", "chr22"], out, base_url=server.base_url + "/")
    assert paths == [out / "chr1.fa.gz", out / "chr22.fa.gz"]
    assert_only_final_files(out, ["chr1.fa.gz", "chr22.fa.gz"])
    assert server.file_requests() == [("chr1.fa.gz", None), ("chr22.fa.gz", None)]
    assert read_md5sums(server.base_url)["chr22.fa.gz"] == hashlib.md5(FILES["chr22.fa.gz"]).hexdigest()


def test_resumes_a_partial_part_file(server, tmp_path):
    half = len(FILES["chr22.fa.gz"]) // 2
    (tmp_path / "chr22.fa.gz.part").write_bytes(FILES["chr22.fa.gz"][:half])
    fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    assert server.file_requests() == [("chr22.fa.gz", f"bytes={half}-")]
    assert_only_final_files(tmp_path, ["chr22.fa.gz"])


def test_response_cut_short_is_resumed_in_the_same_run(server, tmp_path):
    server.cut_after, server.cut_times = 10_000, 1
    fetch_chromosomes(["chr1"], tmp_path, base_url=server.base_url)
    assert server.file_requests() == [("chr1.fa.gz", None), ("chr1.fa.gz", "bytes=10000-")]
    assert_only_final_files(tmp_path, ["chr1.fa.gz"])


def test_download_cut_short_every_time_keeps_the_part_for_a_rerun(server, tmp_path):
    server.cut_after, server.cut_times = 1_000, 99
    with pytest.raises(GenomeLMError, match="cut short 3 times; rerun .* to resume"):
        fetch_chromosomes(["chr1"], tmp_path, base_url=server.base_url)
    assert [p.name for p in tmp_path.iterdir()] == ["chr1.fa.gz.part"]
    assert (tmp_path / "chr1.fa.gz.part").read_bytes() == FILES["chr1.fa.gz"][:3_000]
    server.cut_times = 0
    fetch_chromosomes(["chr1"], tmp_path, base_url=server.base_url)
    assert server.file_requests()[-1] == ("chr1.fa.gz", "bytes=3000-")
    assert_only_final_files(tmp_path, ["chr1.fa.gz"])


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    server.ignore_range = True
    (tmp_path / "chr22.fa.gz.part").write_bytes(FILES["chr22.fa.gz"][:5000])
    fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    assert server.file_requests() == [("chr22.fa.gz", "bytes=5000-")]  # asked, got 200
    assert_only_final_files(tmp_path, ["chr22.fa.gz"])


def test_complete_part_file_is_verified_after_416(server, tmp_path):
    (tmp_path / "chr22.fa.gz.part").write_bytes(FILES["chr22.fa.gz"])
    fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    assert_only_final_files(tmp_path, ["chr22.fa.gz"])


def test_a_file_that_disagrees_with_md5sum_txt_is_named_as_such_not_rerun(server, tmp_path):
    good = FILES["chr22.fa.gz"]
    server.files["chr22.fa.gz"] = good[:1000] + bytes([good[1000] ^ 0xFF]) + good[1001:]  # md5sum.txt is for `good`
    expected = hashlib.md5(FILES["chr22.fa.gz"]).hexdigest()
    got = hashlib.md5(server.files["chr22.fa.gz"]).hexdigest()
    with pytest.raises(GenomeLMError, match=f"checksum mismatch.*expected md5 {expected}.*got {got} from two whole "
                       "downloads; the server's file and its md5sum.txt disagree, so a rerun will not help") as e:
        fetch_chromosomes(["chr22"], tmp_path / "data", base_url=server.base_url)
    assert "rerun `genome-lm fetch`" not in str(e.value)
    assert [r for r in server.file_requests() if r[1] is None] == [("chr22.fa.gz", None)] * 2  # twice, from 0
    assert list(tmp_path.iterdir()) == []  # the folder it made, empty, is gone too


def test_a_transfer_corrupted_once_is_downloaded_again_and_verified(server, tmp_path, caplog):
    good = FILES["chr22.fa.gz"]
    bad = good[:1000] + bytes([good[1000] ^ 0xFF]) + good[1001:]
    served = iter([bad, good])

    class Flaky(dict):  # the first GET of chr22 sends corrupted bytes, the next the real file
        def get(self, name, default=None):
            return next(served) if name == "chr22.fa.gz" else super().get(name, default)

    server.files = Flaky(server.files)
    with caplog.at_level(logging.WARNING, logger="genome_lm.genome.fetch"):
        fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    assert_only_final_files(tmp_path, ["chr22.fa.gz"])
    assert "downloading it once more from the start" in caplog.text


def test_missing_chromosome_is_an_error_before_any_download(server, tmp_path):
    with pytest.raises(GenomeLMError, match=r"chr7 not found in .*md5sum\.txt.*chr1, chr22.*--chroms"):
        fetch_chromosomes(["chr1", "7"], tmp_path / "data", base_url=server.base_url)
    assert server.file_requests() == []
    assert list(tmp_path.iterdir()) == []  # no folder made


def test_present_file_with_matching_md5_is_skipped(server, tmp_path, caplog):
    fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    server.requests.clear()
    with caplog.at_level(logging.INFO, logger="genome_lm.genome.fetch"):
        fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    assert server.file_requests() == []
    assert "already present" in caplog.text


def test_present_file_with_wrong_md5_is_replaced(server, tmp_path):
    (tmp_path / "chr22.fa.gz").write_bytes(b"not the right file")
    fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    assert_only_final_files(tmp_path, ["chr22.fa.gz"])


def test_network_errors_name_the_url_and_the_fix(server, tmp_path):
    with pytest.raises(GenomeLMError, match=r"/nowhere/md5sum\.txt: HTTP 404.*check --base-url / your connection"):
        fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url.replace("/hg38", "/nowhere"))
    with socket.socket() as s:  # a port on which nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(GenomeLMError, match=rf"127\.0\.0\.1:{port}/md5sum\.txt.*check --base-url / your connection"):
        fetch_chromosomes(["chr22"], tmp_path, base_url=f"http://127.0.0.1:{port}")


def test_unwritable_out_dir(server, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(GenomeLMError, match="cannot write to .*a_file/hg38.*--out"):
        fetch_chromosomes(["chr22"], blocker / "hg38", base_url=server.base_url)
    with pytest.raises(GenomeLMError, match=f"^--out {blocker} is a file; give a folder$"):
        fetch_chromosomes(["chr22"], blocker, base_url=server.base_url)


def test_cli_exit_codes_and_no_traceback(server, tmp_path, capsys):
    out = tmp_path / "hg38"
    assert main(["fetch", "--chroms", "22", "--out", str(out), "--base-url", server.base_url]) == 0
    assert_only_final_files(out, ["chr22.fa.gz"])
    assert main(["fetch", "--chroms", "chr7", "--out", str(out), "--base-url", server.base_url]) == 2
    err = capsys.readouterr().err
    assert "genome-lm fetch: error: chr7 not found" in err and "Traceback" not in err


def test_two_different_corrupted_transfers_ask_for_a_rerun(server, tmp_path):
    good = FILES["chr22.fa.gz"]
    served = iter([good[:500] + b"x" + good[501:], good[:900] + b"y" + good[901:]])

    class Flaky(dict):
        def get(self, name, default=None):
            return next(served) if name == "chr22.fa.gz" else super().get(name, default)

    server.files = Flaky(server.files)
    with pytest.raises(GenomeLMError, match="the transfer corrupts data; the downloads were deleted, rerun"):
        fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    assert list(tmp_path.iterdir()) == []


def test_a_mismatching_file_is_kept_until_its_replacement_is_verified(server, tmp_path):
    (tmp_path / "chr22.fa.gz").write_bytes(b"not the right file")
    server.files.pop("chr22.fa.gz")  # listed in md5sum.txt, but the server answers 404 for it
    with pytest.raises(GenomeLMError, match="HTTP 404"):
        fetch_chromosomes(["chr22"], tmp_path, base_url=server.base_url)
    assert (tmp_path / "chr22.fa.gz").read_bytes() == b"not the right file"


def test_a_download_stopped_early_says_what_it_keeps(server, tmp_path, capsys, monkeypatch):
    from genome_lm.genome import fetch

    real = fetch._download_once

    def stopped(url, part):
        real(url, part)
        part.write_bytes(part.read_bytes()[:1000])
        raise KeyboardInterrupt  # Ctrl-C during the download

    monkeypatch.setattr(fetch, "_download_once", stopped)
    out = tmp_path / "hg38"
    assert main(["fetch", "--chroms", "chr22", "--out", str(out), "--base-url", server.base_url]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"genome-lm fetch: interrupted; chr22.fa.gz.part in {out} (the bytes received) are kept, and the same fetch "
        "command resumes from them")
    monkeypatch.setattr(fetch, "_download_once", real)
    assert main(["fetch", "--chroms", "chr22", "--out", str(out), "--base-url", server.base_url]) == 0
    assert_only_final_files(out, ["chr22.fa.gz"])
