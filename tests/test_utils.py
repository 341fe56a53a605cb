"""`utils.atomic_file`: the one atomic-write helper (JSON, synthetic FASTA, eval cache, report)."""

import os
import stat

import pytest

from genome_lm.utils import atomic_file, write_json_atomic


def test_atomic_file_renames_when_complete_with_plain_permissions(tmp_path):
    path = tmp_path / "x.bin"
    with atomic_file(path, "wb") as f:
        f.write(b"abc")
        assert not path.exists()  # readers see nothing until the block ends
    assert path.read_bytes() == b"abc"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]


def test_atomic_file_error_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "x.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(RuntimeError), atomic_file(path) as f:
        f.write("half")
        raise RuntimeError
    assert path.read_text() == '{\n  "a": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_parse_size_has_one_meaning_of_g():
    from genome_lm.errors import GenomeLMError
    from genome_lm.utils import parse_size

    assert parse_size("512k") == 2**19 and parse_size("1M") == 2**20 and parse_size(4096) == 4096
    assert parse_size("5G") == parse_size("5GiB") == parse_size("5 gib") == 5 * 2**30  # bare G: GiB
    assert parse_size("141GB") == 141 * 10**9 and parse_size("2TB") == 2 * 10**12  # GB, TB: powers of ten
    assert parse_size("1.5GiB") == 3 * 2**29 and parse_size("1.5k") == 1536 and parse_size("7B") == 7
    for bad in ("12q", "1.5", "0.1k", "-2TiB", "GiB", "3i", ""):
        with pytest.raises(GenomeLMError, match="--x: cannot read"):
            parse_size(bad, "--x")
