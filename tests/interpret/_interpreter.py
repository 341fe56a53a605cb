"""Run fla's Triton kernels on CPU tensors: Triton's interpreter plus two shims.

Import this before triton is imported (fla imports it, and so does transformers' glm5_next
when fla is importable): `triton.jit` picks the interpreter at decoration time.

1. Autotuning: every `triton.autotune` kernel keeps the first config that pruning leaves, so
   nothing is benchmarked (benchmarking needs a GPU driver, and would take minutes anyway).
2. Loop variables: in compiled Triton the variable of a `range`/`tl.range` loop over runtime
   bounds is a tensor; the interpreter makes it a Python int, and fla calls `i_t.to(tl.int64)`.
   Such loops are rewritten so the variable is an int32 tensor (static loops keep ints).
3. Masks: a mask combined from a `tl.static_range` index and a runtime bound (fla's
   `causal_conv1d` backward: `(t < seq_len) & m_d`) comes out int32 in the interpreter, whose
   masked loads and stores take only bool; such a mask is cast to bool (nonzero = true), as
   compiled Triton reads it.
4. Builtins under another name: the interpreter hands `triton.language`'s builtins their
   semantics by patching the `tl` module; fla binds `gather = tl.gather` at import (used by
   KDA's safe-gate kernels), which that misses. A kernel's module-level aliases of builtins are
   patched alike while it runs.
5. Dot precision: the safe-gate kernels ask `tl.dot` for `input_precision="bf16x3"`, which the
   interpreter's options do not list; its dot is a float32 numpy matmul whatever the
   precision, so "bf16x3" is added to the list (the result is what "ieee" gives).

`fla_cp_on_cpu()` (called by a test's gloo workers, after fla is importable) lets fla's own
context parallelism run there too: its device check (NVIDIA or Ascend only) accepts CPU tensors,
and its all-gather into a [world, ...] tensor, which gloo rejects (gloo takes only the flat
[world·n, ...] form NCCL also accepts), gathers flat and views the result.
"""

import ast
import os
import sys
import warnings

if "fla" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("fla was imported before Triton's interpreter was switched on; import this module first")
os.environ["TRITON_INTERPRET"] = "1"
# fla's import-time notice that no GPU driver is active: expected here
warnings.filterwarnings("ignore", message="Triton is not supported on current platform", category=UserWarning)

import numpy as np
import triton.language as tl
from triton.runtime import autotuner, interpreter

_RANGE_CALL = "_genome_lm_interpreter_range"


def _first_config_only() -> None:
    """Autotuning would benchmark every config; keep the first one that pruning leaves."""
    prune = autotuner.Autotuner.prune_configs
    if getattr(prune, "_genome_lm_shim", False):
        return

    def prune_configs(self, kwargs):
        return prune(self, kwargs)[:1]

    prune_configs._genome_lm_shim = True
    autotuner.Autotuner.prune_configs = prune_configs


def _interpreter_range(range_fn, *args, **kwargs):
    """`range(...)` / `tl.range(...)` inside a kernel; the loop variable is a tensor when any
    bound is (a runtime value), as in compiled Triton, so `i_t.to(tl.int64)` works."""
    steps = range_fn(*args, **kwargs)
    if not any(isinstance(a, tl.tensor) for a in (*args, *kwargs.values())):
        yield from steps
        return
    for i in steps:
        yield interpreter.interpreter_semantic.to_tensor(i, False)


class _Transformer(interpreter.ASTTransformer):
    def visit_For(self, node):
        node = self.generic_visit(node)
        call = node.iter
        is_range = isinstance(call, ast.Call) and (
            (isinstance(call.func, ast.Name) and call.func.id == "range")
            or (isinstance(call.func, ast.Attribute) and call.func.attr == "range")
        )
        if is_range:
            node.iter = ast.copy_location(
                ast.Call(func=ast.Name(id=_RANGE_CALL, ctx=ast.Load()), args=[call.func, *call.args],
                         keywords=call.keywords),
                call,
            )
        return node


def _tensor_loop_variables() -> None:
    if isinstance(interpreter.FunctionRewriter.ast_transformer, _Transformer):
        return
    # the rewriter execs kernels with the interpreter module's globals added to theirs
    setattr(interpreter, _RANGE_CALL, _interpreter_range)
    interpreter.FunctionRewriter.ast_transformer = _Transformer()


def _bool_masks() -> None:
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_masked_load, "_genome_lm_shim", False):
        return
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data != 0, tl.int1)

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, as_bool(mask), cache_policy)

    create_masked_load._genome_lm_shim = True
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store


def _builtin_aliases() -> None:
    patch_lang = interpreter._patch_lang
    if getattr(patch_lang, "_genome_lm_shim", False):
        return

    def _patch_lang(fn):
        scope = patch_lang(fn)
        module = sys.modules.get(fn.__module__)
        if module is not None:
            for name, value in list(fn.__globals__.items()):
                if tl.core.is_builtin(value):
                    interpreter._patch_attr(module, name, value, interpreter.interpreter_builder, scope)
        return scope

    _patch_lang._genome_lm_shim = True
    interpreter._patch_lang = _patch_lang


def _dot_precisions() -> None:
    options = interpreter.interpreter_builder.options
    if "bf16x3" not in options.allowed_dot_input_precisions:  # a frozen dataclass
        object.__setattr__(options, "allowed_dot_input_precisions", (*options.allowed_dot_input_precisions, "bf16x3"))


def fla_cp_on_cpu() -> None:
    import importlib

    import torch
    import torch.distributed as dist

    comm, context = importlib.import_module("fla.ops.cp.comm"), importlib.import_module("fla.ops.cp.context")
    if getattr(comm.all_gather_into_tensor, "_genome_lm_shim", False):
        return
    gather, check = comm.all_gather_into_tensor, context._check_cp_device

    def all_gather_into_tensor(inp, out=None, group=None, async_op=False):
        world = dist.get_world_size(group=group)
        flat = torch.empty(world * inp.shape[0], *inp.shape[1:], device=inp.device, dtype=inp.dtype)
        dist.all_gather_into_tensor(flat, inp.contiguous(), group=group)
        gathered = flat.view(world, *inp.shape)
        return (gathered if out is None else out.copy_(gathered)), None

    def check_cp_device(device):
        if device.type != "cpu":
            check(device)

    all_gather_into_tensor._genome_lm_shim = True
    for name in ("comm", "context", "chunk_delta_h", "chunk_fwd", "chunk_bwd", "chunk_merge"):
        module = importlib.import_module(f"fla.ops.cp.{name}")  # each bound the originals at import
        if getattr(module, "all_gather_into_tensor", None) is gather:
            module.all_gather_into_tensor = all_gather_into_tensor
        if getattr(module, "_check_cp_device", None) is check:
            module._check_cp_device = check_cp_device


def install() -> None:
    _first_config_only()
    _tensor_loop_variables()
    _bool_masks()
    _builtin_aliases()
    _dot_precisions()


install()
