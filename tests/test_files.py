"""`files.atomic_file`: the one atomic-write helper (JSON, synthetic FASTA, eval cache, report)."""

import os
import stat

import pytest

from genome_lm.outputs import atomic_file, write_json_atomic


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
