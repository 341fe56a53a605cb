"""`genome-lm fetch`: download hg38 chromosomes from UCSC, resumable, verified against the server's
md5sum.txt (docs/prepare.md). Standard library only (urllib); progress through tqdm."""

from __future__ import annotations

import http.client
import logging
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from genome_lm import __version__
from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import check_writable
from genome_lm.genome.params import DEFAULT_BASE_URL, FetchParams
from genome_lm.outputs import file_digest, holding

log = logging.getLogger(__name__)

CHUNK = 1 << 20
ATTEMPTS = 3  # downloads cut short are resumed this many times in one run
TIMEOUT = 60.0  # seconds without an answer before a request fails
_MD5_LINE = re.compile(r"^([0-9a-fA-F]{32})\s+\*?(\S+)\s*$")


def add_chr_prefix(name: str) -> str:
    """The UCSC file name of a chromosome: 'chr' added where missing, case kept (UCSC's are case-sensitive)."""
    name = name.strip()
    if not name:
        raise GenomeLMError("empty chromosome name; pass e.g. --chroms chr1,chr2,chr22")
    return name if name.startswith("chr") else f"chr{name}"


def _network_error(url: str, err: BaseException) -> GenomeLMError:
    reason = (f"HTTP {err.code} {err.reason}" if isinstance(err, urllib.error.HTTPError)
              else str(err.reason) if isinstance(err, urllib.error.URLError) else str(err) or type(err).__name__)
    return GenomeLMError(f"cannot download {url}: {reason}; check --base-url / your connection")


def _open(url: str, offset: int = 0):
    """urlopen from byte `offset`; None when the server says it is at or past the end (HTTP 416)."""
    headers = {"User-Agent": f"genome-lm/{__version__}", "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT)
    except (OSError, http.client.HTTPException) as e:  # urllib's URLError and HTTPError are OSErrors
        if isinstance(e, urllib.error.HTTPError) and e.code == 416 and offset:
            e.close()
            return None
        raise _network_error(url, e) from None
    except ValueError as e:  # malformed URL
        raise GenomeLMError(f"bad URL {url!r} ({e}); check --base-url") from None


def read_md5sums(base_url: str) -> dict[str, str]:
    """{file name: md5 hex} from `{base_url}/md5sum.txt`."""
    url = f"{base_url}/md5sum.txt"
    with _open(url) as resp:
        try:
            text = resp.read().decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException) as e:
            raise _network_error(url, e) from None
    sums = {m.group(2): m.group(1).lower() for line in text.splitlines() if (m := _MD5_LINE.match(line))}
    if not sums:
        raise GenomeLMError(f"{url} lists no '<md5>  <file>' lines; check --base-url")
    return sums


def _download_once(url: str, part: Path) -> bool:
    """Append the rest of `url` to `part` (resuming when it is not empty). True if the server
    sent everything it announced; False if the body was cut short (the bytes received are kept)."""
    offset = part.stat().st_size if part.exists() else 0
    if (resp := _open(url, offset)) is None:  # .part already holds the whole file (or more): the md5 decides
        return True
    with resp:
        if resp.status == 206:
            m = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != offset:
                raise GenomeLMError(f"{url}: the server answered a resume request with the wrong range; "
                                    f"delete {part} and rerun")
            mode = "ab"
        else:
            if offset:
                log.info("%s: the server ignored the resume request; downloading from the start", url)
            offset, mode = 0, "wb"
        expected = int(resp.headers["Content-Length"]) if "Content-Length" in resp.headers else None
        total = None if expected is None else offset + expected
        received, cut = 0, None
        with open(part, mode) as f, tqdm(
            total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
            desc=part.name.removesuffix(".part"), leave=False, disable=None,  # no bar when stderr is not a terminal
        ) as bar:
            while True:
                try:
                    chunk = resp.read(CHUNK)
                except (OSError, http.client.HTTPException) as e:
                    cut = str(e) or type(e).__name__
                    break
                if not chunk:
                    break
                f.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    if cut is not None:  # logged once the bar is gone, on a line of its own
        log.warning("%s: %s after %d bytes", url, cut, offset + received)
        return False
    if expected is not None and received < expected:
        log.warning("%s: connection closed after %d of %d bytes", url, offset + received, total)
        return False
    return True


def _download(url: str, part: Path) -> str:
    """Download `url` into `part`, resuming it across up to ATTEMPTS responses cut short; returns its md5."""
    for attempt in range(1, ATTEMPTS + 1):
        if _download_once(url, part):
            return file_digest(part, "md5")
        if attempt < ATTEMPTS:
            log.info("resuming %s (attempt %d of %d)", url, attempt + 1, ATTEMPTS)
    raise GenomeLMError(f"download of {url} was cut short {ATTEMPTS} times; "
                        f"rerun `genome-lm fetch` to resume from {part}")


def _fetch_one(url: str, final: Path, md5: str) -> None:
    """Download `url` to `final` through `final.part`, verified against `md5`. A mismatch downloads the
    file once more from the start: the same wrong md5 twice means the server's file and its md5sum.txt
    disagree (a rerun cannot help); two different ones, a transfer that corrupts data."""
    part = final.with_name(final.name + ".part")
    if part.exists():
        log.info("resuming %s from %d bytes already in %s", url, part.stat().st_size, part)
    if (got := _download(url, part)) != md5:
        part.unlink()
        log.warning("%s: md5 %s, but md5sum.txt lists %s; downloading it once more from the start", url, got, md5)
        if (again := _download(url, part)) != md5:
            part.unlink()
            base = url.rsplit("/", 1)[0]
            if again == got:
                raise GenomeLMError(
                    f"checksum mismatch for {url}: expected md5 {md5} (from {base}/md5sum.txt), got {got} from two "
                    "whole downloads; the server's file and its md5sum.txt disagree, so a rerun will not help: "
                    "check --base-url, or report it to the server's maintainers. Nothing was kept")
            raise GenomeLMError(
                f"checksum mismatch for {url}: expected md5 {md5}, got {got}, then {again}: the transfer corrupts "
                "data; the downloads were deleted, rerun `genome-lm fetch` (or use another --base-url mirror)")
    os.replace(part, final)
    log.info("%s: %d bytes, md5 %s verified", final, final.stat().st_size, md5)


def fetch_chromosomes(chroms: list[str], out_dir: str | os.PathLike, base_url: str = DEFAULT_BASE_URL) -> list[Path]:
    """Download and verify `{chrom}.fa.gz` for each chromosome into `out_dir`; return the paths."""
    out_dir = Path(out_dir)
    base_url = base_url.rstrip("/")
    names = list(dict.fromkeys(add_chr_prefix(c) for c in chroms))
    if not names:
        raise GenomeLMError("no chromosomes given; pass e.g. --chroms chr1,chr2,chr22")
    sums = read_md5sums(base_url)
    if missing := [n for n in names if f"{n}.fa.gz" not in sums]:
        present = sorted(f.removesuffix(".fa.gz") for f in sums if f.endswith(".fa.gz"))
        shown = ", ".join(present[:30]) + (", ..." if len(present) > 30 else "")
        raise GenomeLMError(
            f"{', '.join(missing)} not found in {base_url}/md5sum.txt "
            f"(it lists: {shown or 'no .fa.gz files'}); check --chroms"
        )
    existed = out_dir.exists()
    check_writable(out_dir)  # made once the server and the names are known to be good
    paths = [out_dir / f"{name}.fa.gz" for name in names]
    try:
        with holding(out_dir, "fetch", inside=True):  # one fetch at a time appends to a folder's .part files
            for final in paths:
                md5 = sums[final.name]
                if final.exists():
                    if file_digest(final, "md5") == md5:
                        log.info("%s already present, md5 %s matches; skipped", final, md5)
                        continue
                    log.warning("%s exists but its md5 does not match %s; downloading it again (the file there is "
                                "replaced only once the new one is verified)", final, md5)
                log.info("downloading %s/%s -> %s", base_url, final.name, final)
                _fetch_one(f"{base_url}/{final.name}", final, md5)
    except BaseException:
        if not existed and not any(out_dir.iterdir()):  # it made the folder and kept nothing in it
            out_dir.rmdir()
        raise
    return paths


def fetch_command(p: FetchParams) -> None:
    fetch_chromosomes(p.chroms, p.out, base_url=p.base_url)
