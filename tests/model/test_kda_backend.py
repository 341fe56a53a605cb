"""Which backend a KDA call uses (`GENOME_LM_KDA_BACKEND`), and the errors that name the fix.

fla's kernels themselves run in the interpreter tier (`make test-interpret`, tests/interpret).
"""

import pytest

from genome_lm.errors import GenomeLMError
from genome_lm.model.ops.kda import _fla
from genome_lm.model.ops.kda import chunk as chunk_mod
from genome_lm.model.ops.kda.chunk import chunk_kda
from tests.model.test_kda import make_inputs

MISSING = (None, "ModuleNotFoundError: No module named 'triton'")


@pytest.mark.parametrize(
    "env,cuda,cpu",
    [(None, True, False), ("", True, False), ("auto", True, False), (" Auto ", True, False), ("fla", True, True),
     ("torch", False, False)],
)
def test_backend_by_device(monkeypatch, env, cuda, cpu):
    if env is None:
        monkeypatch.delenv(_fla.BACKEND_ENV, raising=False)
    else:
        monkeypatch.setenv(_fla.BACKEND_ENV, env)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _fla.use_fla("cuda") is cuda
    assert _fla.use_fla("cpu") is cpu


def test_unknown_backend_is_a_user_error(monkeypatch):
    monkeypatch.setenv(_fla.BACKEND_ENV, "triton")
    q, k, v, g, beta, _ = make_inputs(0, T=5)
    with pytest.raises(GenomeLMError, match=r"^GENOME_LM_KDA_BACKEND='triton': use one of auto, fla, torch"):
        chunk_kda(q, k, v, g, beta)


def test_fla_backend_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv(_fla.BACKEND_ENV, "fla")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v, g, beta, _ = make_inputs(0, T=5)
    with pytest.raises(GenomeLMError, match="needs Triton's interpreter: set TRITON_INTERPRET=1"):
        chunk_kda(q, k, v, g, beta)


def test_missing_fla_is_an_error_naming_the_fix(monkeypatch):
    # what a CUDA call meets without the gpu extra: no silent fallback to the torch op
    monkeypatch.setattr(_fla, "_import_fla", lambda module, name: MISSING)
    monkeypatch.setattr(chunk_mod, "use_fla", lambda device_type: True)
    q, k, v, g, beta, _ = make_inputs(0, T=5)
    with pytest.raises(GenomeLMError) as err:
        chunk_kda(q, k, v, g, beta)
    message = str(err.value)
    assert "\n" not in message
    assert "No module named 'triton'" in message and "pip install -e '.[gpu]'" in message
    assert "GENOME_LM_KDA_BACKEND=torch" in message


@pytest.mark.parametrize("version,ok", [("0.5.2", False), ("0.6.0", True), ("0.6.1", True)])
def test_fla_older_than_the_int64_and_b200_fixes_is_an_error(monkeypatch, version, ok):
    monkeypatch.setattr(_fla, "_import_fla", lambda module, name: (len, ""))
    monkeypatch.setattr(_fla.importlib.metadata, "version", lambda dist: version)
    if ok:
        assert _fla.fla_chunk_kda() is len
        return
    with pytest.raises(GenomeLMError, match=rf"fla-core {version} is installed; .* needs fla-core >= 0.6.0 .*"
                                            r"pip install -e '.\[gpu\]'"):
        _fla.fla_chunk_kda()


def test_fla_import_failure_is_reported_not_raised(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "fla.ops.kda", None)  # makes the import raise ImportError
    fn, error = _fla._import_fla.__wrapped__("fla.ops.kda", "chunk_kda")
    assert fn is None and error.startswith("ModuleNotFoundError: ")


def test_torch_backend_keeps_cpu_on_torch(monkeypatch):
    monkeypatch.setenv(_fla.BACKEND_ENV, "torch")

    def boom():
        raise AssertionError("fla must not be looked up with GENOME_LM_KDA_BACKEND=torch")

    monkeypatch.setattr(chunk_mod, "fla_chunk_kda", boom)
    q, k, v, g, beta, _ = make_inputs(1, T=5)
    o, _ = chunk_kda(q, k, v, g, beta)
    assert o.shape == v.shape
