"""The project speaks of itself only: no tracked text file narrates how it came to be.

Docs, README, code, tests, benchmarks, experiments, notebooks and tools describe the software as
it is; history belongs in git log. This test reads every file `git ls-files` lists (text files
only) and reports each line that narrates history as `path:line: text`:

- numbered rounds or sessions of work ("round 3", "R2", "session 20", "sessions 12-19");
- tracker numbers of the project ("issue 12", "issue-16", "#12" in prose); a reference to another
  project's tracker (`owner/repo#123`, `owner/repo/issues/123`) is a source and is allowed;
- commit hashes: a 7-40 hex-digit token after "commit", "tree of", "revision", "fixed in" and the
  like, or a bare 7-12 hex-digit token with letters and digits in prose (not in lock files or JSON
  data, whose checksums and ids are data);
- phrases that date the text: "until recently", "an earlier version", "in a previous session",
  "as of this commit", "no GPU was available", "now fixed", ...;
- narration of a change, matched by its grammar rather than a list of sentences: "before this change",
  "since the fix", "the planner used to", "no longer counts", "is now", "it is float32 now", "now uses",
  "was renamed", "we moved", "originally", "for now". What data or a run does at run time is not
  history: "a manifest that no longer matches its checksum", "the value is used to scale",
  "manifest.json was changed after prepare wrote it" pass.

A finding is written as a result with the command that reproduces it; a change is described in its
commit message.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Lines of notebooks' JSON that are metadata, not text (cell ids are 8 hex digits).
NOTEBOOK_METADATA = re.compile(r'^\s*"(id|execution_count|version|nbformat(_minor)?)"\s*:')
# Files whose hex tokens are data (checksums, ids), never prose: scanned for every pattern but the
# bare hex token.
DATA_SUFFIXES = (".lock", ".json", ".jsonl", ".tsv", ".csv", ".bed", ".fa", ".fasta")

# A reference to another project's tracker ends the text before the number: a source, allowed.
OTHER_TRACKER = re.compile(r"[\w.-]+/[\w.-]+(?:/issues/|/pull/|#|'s (?:issue|PR|pull request) ?)$", re.I)
HEX_ID = r"(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]"  # hex digits, at least one a-f and one 0-9

PATTERNS: list[tuple[str, re.Pattern]] = [
    ("numbered round of work", re.compile(r"\b(?:rounds?|sprints?)\s+\d+\b|\bR\d{1,2}\b", re.I)),
    ("numbered session", re.compile(r"\bsessions?\s+\d+\b", re.I)),
    ("tracker number", re.compile(r"(?<![a-z])(?:issues?|tickets?|bugs?)(?:\s*#\s*|\s+|-|_)?\d+\b(?!\.\d)", re.I)),
    # "#12" in prose: not a CSS colour (`color: #222`), not `# 12` (a comment), not `&#12;`
    ("tracker number", re.compile(r"(?<![\w&#:])(?<!:\s)#\d{1,5}\b(?![\w;])")),
    ("commit hash", re.compile(r"\b(?:commits?|tree of|revision|rev|sha|fixed in|as of|since|before|after|"
                               r"cherry-picked|reverted|introduced in|landed in)\s+(?:of\s+)?"
                               rf"{HEX_ID}{{7,40}}\b", re.I)),
    ("dated phrase", re.compile(
        r"\buntil recently\b|\bearlier versions?\b|\bprevious (?:session|version|round)s?\b|"
        r"\b(?:this|that|each|every|another|later|earlier|next|last|helper) session\b(?!-scoped| fixture| scope)|"
        r"\bas of this commit\b|\bas of (?:today|now)\b|"
        r"\bno GPU was\b|\bGPU was (?:not )?(?:available|lent)\b|\blent a GPU\b|\bnow fixed\b|"
        r"\bwas fixed\b|\bhas been fixed\b|\bused to (?:be|point|read|run|say|keep|have)\b|"
        r"\bpreviously\b|\bformerly\b|\bthe old behaviou?r\b|\banother engineer\b|\bthe demo before this\b|"
        r"\bthe issue's\b|\b(?:between|across) the sessions\b",
        re.I)),
    # a change to the software, by grammar: "<before|since...> <this|the...> <change|fix...>"
    ("narrated change", re.compile(
        r"\b(?:before|until|since|after|till|prior to) (?:this|the|that|these|those|a recent|the last) "
        r"(?:changes?|fix(?:es)?|commits?|refactors?|refactoring|rewrites?|patch(?:es)?|reverts?|PRs?|merges?)\b|"
        r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )(?<!\bwas )(?<!\bwere )(?<!\bget )(?<!\bgets )"
        r"\bused to\b|"  # "the planner used to count" (the passive "is used to scale" is not history)
        r"(?<!\bor )\bno longer\b(?! (?:matches|match|validates|validate|fits|fit|exists|exist)\b)|"  # run-time state
        r"\banymore\b|\bany more\b|"
        r"\b(?:is|are|was|were) now\b|\bnow (?:is|are|uses?|has|have|does|keeps|counts|takes|holds|reads|writes|runs|"
        r"lives|sits|goes|returns|prints|calls|passes|fails|refuses|accepts|matches|works|gives|needs|checks|loads|saves)\b|"
        r"\b(?:they|it|these|this|those)(?:'re|'s| are| is) (?:\w+ ){0,2}now\b|"  # "they are float32 now"
        r"\b(?:was|were|has been|have been|had been) (?:changed|renamed|moved|replaced|reverted|rewritten|refactored|"
        r"retuned|reworked|redesigned)\b(?! after \w+ wrote)|"
        r"\b(?:first|later|since|subsequently|eventually) (?:reverted|rewritten|renamed|replaced|removed|fixed)\b|"
        r"\bchanged (?:in|to) the (?:planner|code|trainer|model|rehearsal|docs?|tests?|CLI|config)\b|"
        r"\b(?:we|I) (?:changed|fixed|moved|removed|added|renamed|replaced|reverted|rewrote|dropped|switched)\b|"
        r"\b(?:originally|historically|nowadays|lately|recently)\b|\bfor now\b|\bfrom now on\b|\bgoing forward\b|"
        r"\bin the past\b|\bat the time of writing\b",
        re.I)),
]
BARE_HASH = re.compile(rf"(?<![\w/.:#=-])(?!\d+e\d+\b){HEX_ID}{{7,12}}(?![\w/.-])")  # not 2250e12


def tracked_text_files() -> list[tuple[str, list[str]]]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tracked files to read")
    files = []
    for rel in out.decode().split("\0"):
        if not rel or rel == THIS:
            continue
        path = ROOT / rel
        if not path.is_file():
            continue
        raw = path.read_bytes()
        if b"\0" in raw[:8192]:
            continue  # binary
        try:
            files.append((rel, raw.decode("utf-8").splitlines()))
        except UnicodeDecodeError:
            continue
    return files


def history_lines(rel: str, lines: list[str]) -> list[str]:
    """`path:line: text` for each line of file `rel` that narrates history, with what it matched."""
    hits = []
    notebook, data = rel.endswith(".ipynb"), rel.endswith(DATA_SUFFIXES)
    for n, line in enumerate(lines, 1):
        if notebook and NOTEBOOK_METADATA.match(line):
            continue
        found = [(what, m) for what, pattern in PATTERNS for m in pattern.finditer(line)
                 if not (what == "tracker number" and OTHER_TRACKER.search(line[:m.start()]))]
        if not data:  # a bare hex token, unless a pattern above already reported it
            found += [("commit hash", m) for m in BARE_HASH.finditer(line)
                      if not any(f.start() <= m.start() and m.end() <= f.end() for _, f in found)]
        if found:
            what = "; ".join(f"{w} {m.group(0)!r}" for w, m in found)
            hits.append(f"{rel}:{n}: {line.strip()[:160]}  [{what}]")
    return hits


@pytest.mark.parametrize("line, what", [
    ("Fixed in round 3 (issue 12, commit 1a2b3c4).", "round"),
    ("The R2 rewrite keeps the cache.", "round"),
    ("measured in session 20", "session"),
    ("on the demo of sessions 12-19", "session"),
    ("as issue 16 asks", "tracker"),
    ("see #12 for the discussion", "tracker"),
    ('"dp2_issue16": dict(base)', "tracker"),
    ("before (commit 8095dd9)", "hash"),
    ("ran on the tree of 471cc66", "hash"),
    ("the fix (8095dd9) keeps it", "hash"),
    ("Until recently the loader copied every tensor.", "dated"),
    ("an earlier version argued otherwise", "dated"),
    ("checked in a previous session", "dated"),
    ("No GPU was lent to this session.", "dated"),
    ("What used to point up moved to train/", "dated"),
    ("The issue's bar: T = 8k", "dated"),
    ("so it cannot rot between the sessions that have a GPU", "dated"),
    ("180G read 180 x 10^9 (until this change, it read GiB)", "change"),
    ("away (before this change: glm53-tiny, 40 steps)", "change"),
    ("Since the fix the loader keeps one copy.", "change"),
    ("after that refactor the trainer owns it", "change"),
    ("The planner used to count the buffer twice.", "change"),
    ("it no longer counts the buffer twice", "change"),
    ("the flag is not needed anymore", "change"),
    ("The default is now 4.", "change"),
    ("the planner now uses the measured size", "change"),
    ("ignore `.data` assignment); they are float32 now (`to_master_dtype_`)", "change"),
    ("What the rehearsal changed in the planner:", "change"),
    ("train/saver.py was renamed", "change"),
    ("the expert backward was first reverted", "change"),
    ("We moved the check to the loader.", "change"),
    ("Originally the planner had no offload.", "change"),
    ("this is a stand-in for now", "change"),
])
def test_the_patterns_catch_history(line, what):
    assert history_lines("docs/x.md", [line]), f"{what}: {line!r} not caught"


@pytest.mark.parametrize("line", [
    "figcaption { color: #555; font-size: 0.9em; }",
    "x = f(y)  # noqa: E501",
    "## Parity",
    "#### ep=1",
    "Sources: NVIDIA/TensorRT-LLM#10278 and pytorch/ao#4002",
    "fla's upstream fix: https://github.com/fla-org/flash-linear-attention/issues/512",
    '@pytest.fixture(scope="session")',
    "Session-scoped fixtures shared by several folders",
    "in round r, replica d scores window r x dp + d",
    "decoder layers whose all-gather FSDP2 issues ahead of use",
    "sha256:2b5c1f0e0d9a4e3b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3 \\",
    "a checkpoint from an older version is refused",
    "the previous complete checkpoint is used",
    'BF16_PEAK = {"B200": 2250e12}',
    "the value is used to scale the loss",
    "the seed that was used to draw windows",
    "no longer matches its own checksum.",
    "the YAML itself if it no longer validates",
    "{name} is not (or no longer) expected by the plan",
    "S/manifest.json was changed after prepare wrote it (its checksum does not match)",
    "A TCP port on 127.0.0.1 that is free now",
    "After a change that is meant to move them, regenerate it",
    "1k -> 7k is the change in loss, negative when it falls",
    "one line naming the problem and the fix",
    "its checkpoints were removed, and starting over would replace them",
    "15.3% of the bf16 weights changed at each step",
    "the temporary file is written, then renamed",
])
def test_the_patterns_pass_plain_text(line):
    assert history_lines("docs/x.md", [line]) == []


def test_no_tracked_file_narrates_history():
    hits = [hit for rel, lines in tracked_text_files() for hit in history_lines(rel, lines)]
    assert not hits, "history narration (describe the software as it is; history goes in git log):\n" + "\n".join(hits)
