"""Sizes of tokens and bytes, with one meaning of k / M / G everywhere (docs/config.md, Sizes)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from genome_lm.errors import GenomeLMError

DEFAULT_MAX_SHARD_BYTES = 5 * 2**30  # the largest safetensors file of a model directory genome_lm writes
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(value: str | int, what: str = "size") -> int:
    """A size: a bare `k` / `M` / `G` / `T` or `KiB` ... `TiB` is a power of two ('512k' -> 2^19), `KB` ...
    `TB` a power of ten ('141GB' -> 141 x 10^9), in any case; fractions when the result is whole."""
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(str(value))
    unit, tail = (m.group(2).lower(), m.group(3).lower()) if m else ("", "i")
    if m is not None and tail != "i" and (unit or tail != "ib"):  # i, iB without k/M/G/T are not units
        n = Fraction(m.group(1)) * (1000 if tail == "b" else 1024) ** ("kmgt".index(unit) + 1 if unit else 0)
        if n.denominator == 1:
            return int(n)
    raise GenomeLMError(f"{what}: cannot read {value!r} as a size; use an integer or a suffix k/M/G "
                        "(powers of two, e.g. 512k, 1M, 180GiB) or GB/TB (powers of ten, e.g. 141GB)")


def format_size(n: int) -> str:
    """Inverse of parse_size for exact powers: 524288 -> '512k'."""
    for suffix, mult in (("G", 2**30), ("M", 2**20), ("k", 2**10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def _size(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError("expected a size such as 4096, 64k or 1M")
    try:
        return parse_size(v)
    except GenomeLMError as e:
        raise ValueError(str(e).removeprefix("size: ")) from None


Size = Annotated[int, BeforeValidator(_size), Field(gt=0)]
