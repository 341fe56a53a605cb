"""Which backend a KDA call uses (the `kda_backend` setting, handed to every KDA kernel), how the
setting reaches them, and the errors that name the fix.

fla's kernels themselves run in the interpreter tier (`make test-interpret`, tests/interpret).
"""

import pytest
import torch

from genome_lm.config import MemoryConfig
from genome_lm.errors import GenomeLMError
from genome_lm.model.ops.kda import LongKDA, _fla
from genome_lm.model.ops.kda import chunk as chunk_mod
from genome_lm.model.ops.kda import conv as conv_mod
from genome_lm.model.ops.kda import norm as norm_mod
from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.settings import DEFAULTS, parse_kda_backend
from genome_lm.train.parallelize import parallelize
from tests.helpers import tiny_model
from tests.model.test_kda import make_inputs

MISSING = (None, "ModuleNotFoundError: No module named 'triton'")


@pytest.mark.parametrize("backend,cuda,cpu", [("auto", True, False), ("fla", True, True), ("torch", False, False)])
def test_backend_by_device(monkeypatch, backend, cuda, cpu):
    monkeypatch.setattr(_fla, "TRITON_INTERPRETING", True)
    assert _fla.use_fla("cuda", backend) is cuda
    assert _fla.use_fla("cpu", backend) is cpu


@pytest.mark.parametrize("raw,backend", [("", "auto"), ("auto", "auto"), (" Auto ", "auto"), ("fla", "fla"),
                                         ("torch", "torch")])
def test_the_environment_override(raw, backend):
    assert parse_kda_backend(raw) == backend


def test_the_default_is_auto_without_the_override():
    assert DEFAULTS.kda_backend == "auto" == MemoryConfig().kda_backend  # the suite runs without the variable


def test_unknown_backend_is_a_user_error():
    with pytest.raises(GenomeLMError, match=r"^GENOME_LM_KDA_BACKEND='triton': use one of auto, fla, torch"):
        parse_kda_backend("triton")


def test_fla_backend_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setattr(_fla, "TRITON_INTERPRETING", False)
    q, k, v, g, beta, _ = make_inputs(0, T=5)
    with pytest.raises(GenomeLMError, match="needs Triton's interpreter: set TRITON_INTERPRET=1"):
        chunk_kda(q, k, v, g, beta, backend="fla")


def test_stand_ins_take_the_fla_path_on_cpu_fake_tensors_without_the_interpreter(monkeypatch):
    """The rehearsal's `fla` setting (`fake_fla.FAKE_FLA`): fla's call contract on CPU fake tensors;
    fla's own kernels on CPU still need the interpreter."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from genome_lm.model.ops.kda.fake_fla import FAKE_FLA

    monkeypatch.setattr(_fla, "TRITON_INTERPRETING", False)
    assert _fla.use_fla("cpu", "fla", FAKE_FLA) and not _fla.use_fla("cpu", "auto", FAKE_FLA)
    q, k, v, g, beta, _ = make_inputs(0, T=64)
    with FakeTensorMode(allow_non_fake_inputs=True):
        o, final = chunk_kda(q, k, v, g, beta, output_final_state=True, backend="fla", fla=FAKE_FLA)
    assert o.shape == v.shape and final is not None and final.dtype == torch.float32
    with pytest.raises(GenomeLMError, match="needs Triton's interpreter"):
        _fla.use_fla("cpu", "fla")


def test_missing_fla_is_an_error_naming_the_fix(monkeypatch):
    # what a CUDA call meets without the gpu extra: no silent fallback to the torch op
    monkeypatch.setattr(_fla, "_import_fla", lambda module, name: MISSING)
    monkeypatch.setattr(chunk_mod, "use_fla", lambda device_type, backend, fla: True)
    q, k, v, g, beta, _ = make_inputs(0, T=5)
    with pytest.raises(GenomeLMError) as err:
        chunk_kda(q, k, v, g, beta)
    message = str(err.value)
    assert "\n" not in message
    assert "No module named 'triton'" in message and "pip install -e '.[gpu]'" in message
    assert "memory.kda_backend: torch" in message and "GENOME_LM_KDA_BACKEND=torch" in message


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
    def boom(*_):
        raise AssertionError("fla must not be looked up with the torch backend")

    monkeypatch.setattr(chunk_mod, "fla_chunk_kda", boom)
    q, k, v, g, beta, _ = make_inputs(1, T=5)
    o, _ = chunk_kda(q, k, v, g, beta, backend="torch")
    assert o.shape == v.shape


def test_the_setting_reaches_every_kda_kernel(monkeypatch):
    """memory.kda_backend -> parallelize -> LongKDA -> the recurrent op, the short conv and the output
    norm, each asked with that backend (no other source of the choice)."""
    asked = []
    for mod in (chunk_mod, conv_mod, norm_mod):
        monkeypatch.setattr(mod, "use_fla", lambda device_type, backend, fla, name=mod.__name__: asked.append(
            (name.rsplit(".", 1)[1], backend)) or False)
    model = parallelize(tiny_model(0), MemoryConfig(kda_backend="torch"))
    layers = [m for m in model.modules() if isinstance(m, LongKDA)]
    assert layers and {(m.backend, m.conv1d.backend, m.o_norm.backend) for m in layers} == {("torch",) * 3}
    with torch.no_grad():
        model(torch.randint(0, 4, (1, 12)))
    assert {name for name, _ in asked} == {"chunk", "conv", "norm"}
    assert {backend for _, backend in asked} == {"torch"}
