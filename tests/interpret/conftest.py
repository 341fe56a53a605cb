"""The interpreter tier: fla's Triton kernels on CPU tensors, `make test-interpret`.

Collected only when TRITON_INTERPRET=1 is set before pytest starts (the Makefile sets it, and
puts the `triton` wheel on PYTHONPATH for this tier only); the default `make test` run skips
this folder. The shims (`_interpreter.py`) are installed here, before anything imports triton,
and again by each test module, so that spawned gloo workers get them too.
"""

import os

import pytest

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETING:
    from tests.interpret import _interpreter  # noqa: F401  (shims, before triton is imported)
else:
    collect_ignore_glob = ["*.py"]  # not the interpreter tier's own invocation


def pytest_report_header(config):
    if not INTERPRETING:
        return "tests/interpret: collected only with TRITON_INTERPRET=1; run `make test-interpret`"


def pytest_configure(config):
    if INTERPRETING:
        # the interpreter also computes masked-out lanes (exp2 of what the kernel then discards)
        config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
        config.addinivalue_line("filterwarnings", "ignore:Triton is not supported on current platform:UserWarning")


def pytest_sessionstart(session):
    """Every KDA call of the tier goes to fla: the default backend is read once, at import, from
    GENOME_LM_KDA_BACKEND, which spawned workers inherit too."""
    if INTERPRETING:
        from genome_lm.settings import DEFAULTS

        if DEFAULTS.kda_backend != "fla":
            pytest.exit("tests/interpret: start pytest with GENOME_LM_KDA_BACKEND=fla (`make test-interpret` does)",
                        returncode=2)


@pytest.fixture
def fla_calls(monkeypatch):
    """The keyword arguments of every call that reaches fla (so no test passes on the torch path)."""
    from genome_lm.model.ops.kda import chunk as chunk_mod

    calls, real = [], chunk_mod.fla_chunk_kda()

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(chunk_mod, "fla_chunk_kda", lambda *_: counting)
    return calls


@pytest.fixture
def fla_lean_calls(monkeypatch):
    """Names of the calls that reach fla's short convolution ("conv") and gated norm ("norm")."""
    from genome_lm.model.ops.kda import conv as conv_mod
    from genome_lm.model.ops.kda import norm as norm_mod

    calls = []
    for mod, attr, name in [(conv_mod, "fla_causal_conv1d", "conv"), (norm_mod, "fla_rms_norm_gated", "norm")]:
        real = getattr(mod, attr)()

        def counting(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(mod, attr, lambda *_, _fn=counting: _fn)
    return calls
