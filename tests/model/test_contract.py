"""The upstream contract: the installed transformers matches it, and a mismatch is one line with the fix."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from genome_lm.model import build
from genome_lm.model.build import check_upstream
from genome_lm.model.contract import (
    SUPPORTED,
    TESTED,
    UpstreamMismatch,
    attribute_problems,
    check_symbols,
    check_torch,
    symbol_problems,
    torch_problems,
)
from genome_lm.model.upstream import glm

ROOT = Path(__file__).resolve().parents[2]


def test_installed_transformers_matches_the_contract():
    assert symbol_problems() == []
    assert attribute_problems(build("glm53-tiny", meta=True).model) == []
    assert check_upstream().startswith("transformers ")


def test_contract_range_is_pyprojects_and_the_lock_pins_the_tested_version():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"transformers{SUPPORTED}" in deps
    assert re.search(rf"^transformers=={re.escape(TESTED)} ", (ROOT / "requirements.lock").read_text(), re.M)


def test_renamed_attribute_fails_the_build_in_one_line(monkeypatch):
    """transformers 5.24 named the epsilon `eps`; building then names it instead of failing in a forward."""
    def old_init(self, eps: float = 1.0e-6):
        glm.nn.Module.__init__(self)
        self.eps = eps

    monkeypatch.setattr(glm.Glm5NextTextUnweightedRMSNorm, "__init__", old_init)
    with pytest.raises(UpstreamMismatch) as err:
        build("glm53-tiny", meta=True)
    message = str(err.value)
    assert "\n" not in message
    assert "Glm5NextTextUnweightedRMSNorm has no attribute 'variance_epsilon'" in message
    assert f"transformers{SUPPORTED}" in message and "make setup" in message


def test_missing_symbol_and_changed_signature_are_named(monkeypatch):
    monkeypatch.delattr(glm, "causal_conv1d_forward")
    monkeypatch.setattr(glm.Glm5NextTextMoE, "forward", lambda self, hidden_states, router_logits: hidden_states)
    problems = symbol_problems()
    assert f"{glm.__name__} has no causal_conv1d_forward" in problems
    assert ("Glm5NextTextMoE.forward takes (self, hidden_states, router_logits), genome_lm calls it as "
            "(self, hidden_states)") in problems
    check_symbols.cache_clear()
    try:
        with pytest.raises(UpstreamMismatch, match=r"has no causal_conv1d_forward \(and 1 more\)"):
            check_symbols()
    finally:
        check_symbols.cache_clear()


def test_private_torch_the_rehearsal_relies_on_is_checked(monkeypatch):
    """The rehearsal replaces `FSDPMemTracker._update_peak_stats` and reads the tracker's state: a torch
    that renames either is one line when the rehearsal starts, not a tracker that silently stops counting."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.mod_tracker import ModTracker

    assert torch_problems() == []
    monkeypatch.setattr(MemTracker, "_update_peak_stats", lambda self, state, extra: None)
    monkeypatch.delattr(ModTracker, "is_bw")
    assert torch_problems() == [
        "FSDPMemTracker._update_peak_stats takes (self, state, extra), genome_lm calls it as (self, peak_state)",
        "torch's ModTracker has no attribute 'is_bw'"]
    check_torch.cache_clear()
    try:
        with pytest.raises(UpstreamMismatch, match=r"^torch .* does not match genome_lm's rehearsal: "
                                                   r"FSDPMemTracker._update_peak_stats takes .* \(and 1 more\); "
                                                   r"tested on torch 2.13.0. Fix: `make setup`"):
            check_torch()
    finally:
        check_torch.cache_clear()


FAKE_OLD_TRANSFORMERS = """
import sys
import transformers.models.glm5_next.modeling_glm5_next as glm
del glm.causal_conv1d_forward
from genome_lm.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_on_a_mismatched_transformers_is_one_line_exit_2(tmp_path):
    """Every command stops before it starts, with the mismatch and the fix, and writes nothing."""
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-c", FAKE_OLD_TRANSFORMERS, "train", str(ROOT / "experiments/demo_base.yaml"),
         "--out", str(out)], capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2, result.stderr
    # one line of genome_lm's; where triton is importable without a GPU driver, fla's import may add
    # its own UserWarning about rolling back to CPU above it
    lines = [ln for ln in result.stderr.strip().splitlines() if "Warning" not in ln and not ln.startswith("  ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("genome-lm train: error: transformers ")
    assert "has no causal_conv1d_forward" in lines[0] and "make setup" in lines[0]
    assert not out.exists()


def test_cli_check_upstream_passes_on_the_installed_transformers():
    result = subprocess.run([sys.executable, "-m", "genome_lm", "check-upstream"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "matches genome_lm" in result.stdout
