"""`python -m tests.sweep [WORDS]`: run the sweep (the cases whose id holds WORDS), print the table,
and write benchmarks/results/sweep_cli.json (when every case ran). SWEEP_WORLD=DIR keeps the shared
inputs in DIR for the next run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tests.sweep.cases import CASES
from tests.sweep.table import run_case
from tests.sweep.world import World

TESTS = Path(__file__).resolve().parents[1]
RESULTS = TESTS.parent / "benchmarks" / "results" / "sweep_cli.json"


def tested_elsewhere(line: str, sources: str) -> bool:
    """Whether a test outside the sweep already asserts this message: a stretch of 25 characters of
    it between paths and numbers appears in one."""
    message = line.split(": error: ", 1)[-1]
    pieces = re.split(r"\S*/\S*|\d[\d,.]*", message)
    return any(len(p.strip()) >= 25 and p.strip()[:25] in sources for p in pieces)


def main(words: str = "") -> int:
    chosen = [c for c in CASES if words in c.id]
    sources = "\n".join(p.read_text() for p in TESTS.rglob("*.py") if "sweep" not in p.parts)
    keep = os.environ.get("SWEEP_WORLD")  # a folder that keeps the shared inputs from one run to the next
    with contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory(prefix="sweep-") as root:
        world = World.kept(Path(root))
        results = []
        for i, case in enumerate(chosen):
            r = run_case(case, world, i)
            results.append(r)
            r.new = not tested_elsewhere(r.line, sources)
            print(f"{case.id} | {r.code} | {r.line[:160]} | {r.verdict}{' | new' if r.new else ''}", flush=True)
    bad = [r for r in results if r.problems]
    counts = Counter(r.case.command for r in results)
    new = sum(r.new for r in results)
    print(f"\n{len(results)} cases ({', '.join(f'{c} {n}' for c, n in counts.items())}); {new} new; {len(bad)} bad")
    if not words:
        RESULTS.write_text(json.dumps({"cases": [{"case": r.case.id, "argv": r.case.argv, "exit": r.code,
                                                  "expected_exit": r.case.exit, "line": r.line,
                                                  "verdict": r.verdict, "new": r.new}
                                                 for r in results], "counts": counts}, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
