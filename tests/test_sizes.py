"""`sizes.parse_size`: one meaning of k, M, G for every size of every command (docs/config.md, Sizes)."""

import pytest

from genome_lm.errors import GenomeLMError
from genome_lm.sizes import parse_size


def test_parse_size_has_one_meaning_of_g():
    assert parse_size("512k") == 2**19 and parse_size("1M") == 2**20 and parse_size(4096) == 4096
    assert parse_size("5G") == parse_size("5GiB") == parse_size("5 gib") == 5 * 2**30  # bare G: GiB
    assert parse_size("141GB") == 141 * 10**9 and parse_size("2TB") == 2 * 10**12  # GB, TB: powers of ten
    assert parse_size("1.5GiB") == 3 * 2**29 and parse_size("1.5k") == 1536 and parse_size("7B") == 7
    for bad in ("12q", "1.5", "0.1k", "-2TiB", "GiB", "3i", ""):
        with pytest.raises(GenomeLMError, match="--x: cannot read"):
            parse_size(bad, "--x")
