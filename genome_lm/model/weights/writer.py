"""`save_pretrained` / `write_model_dir`: a Hugging Face-style text-only directory in real checkpoints'
key layout (`layout.py`), streamed one tensor at a time into files planned up front, each written when its
last tensor arrives."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from genome_lm.errors import GenomeLMError
from genome_lm.model.weights.layout import TensorSpec, cast_dtype, cast_tensor, model_tensors, to_disk_layout
from genome_lm.outputs import atomic_directory, umask
from genome_lm.sizes import DEFAULT_MAX_SHARD_BYTES

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM

Item = TypeVar("Item")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def byte_batches(items: Iterable[Item], nbytes: Callable[[Item], int], max_bytes: int) -> Iterator[list[Item]]:
    """`items` in order, in consecutive batches of at most `max_bytes` (a larger item alone)."""
    batch: list[Item] = []
    size = 0
    for item in items:
        if batch and size + nbytes(item) > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += nbytes(item)
    if batch:
        yield batch


def _save_shard(shard: dict[str, torch.Tensor], path: Path) -> None:
    try:
        save_file(shard, str(path), metadata={"format": "pt"})
    except SafetensorError as e:  # an I/O failure comes back as "... (os error N)": raise it as the OSError
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from None
    os.chmod(path, 0o666 & ~umask())  # safetensors writes 0600; a shared group reads what the umask allows


def save_pretrained(model: Glm5NextCausalLM, out_dir: str | Path, *, overwrite: bool = False,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, write: bool = True,
                    dtype: torch.dtype | None = None, tokenizer_from: str | Path | None = None) -> Path:
    """Write `model` to `out_dir` (atomic; existing: an error, or replaced with `overwrite`):
    `config.json`, safetensors sharded past `max_shard_bytes`, tokenizer files from `tokenizer_from`
    (a directory); `build(dir)` rebuilds it. `dtype`: write in it. Streamed, about one file plus one
    tensor beyond the model; a sharded (FSDP2) model is gathered one tensor at a time: every rank
    calls it, only the one with `write=True` writes.
    """
    tensors = model_tensors(model)
    if meta := [name for name, tensor in tensors.items() if tensor.is_meta]:
        raise GenomeLMError(f"model: cannot save a model built on the meta device ({meta[0]} has no data)")
    specs = [(name, tuple(t.shape), cast_dtype(name, t.dtype, dtype)) for name, t in tensors.items()]
    gathered = ((name, cast_tensor(name, t.full_tensor() if isinstance(t, DTensor) else t, dtype))
                for name, t in tensors.items())
    if not write:
        for _ in gathered:
            pass
        return Path(out_dir)
    return write_model_dir(model, out_dir, specs, gathered, overwrite=overwrite, max_shard_bytes=max_shard_bytes,
                           tokenizer_from=tokenizer_from)


def write_model_dir(model: Glm5NextCausalLM, out_dir: str | os.PathLike, specs: list[TensorSpec],
                    tensors: Iterable[tuple[str, torch.Tensor]], *, overwrite: bool = False,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, inputs: Iterable[str | Path] = (),
                    tokenizer_from: str | Path | None = None) -> Path:
    """`save_pretrained`'s directory from full tensors in the order of `specs`; `model` (meta is fine)
    gives the config; `inputs` (what the weights came from) may not lie inside `out_dir`."""
    out_dir = Path(out_dir)
    config = model.config.to_dict()
    config["architectures"] = ["Glm5NextTextModel"]
    dtypes = {name: dtype for name, _, dtype in specs}
    head = dtypes.get("lm_head.weight", dtypes.get("model.embed_tokens.weight", model.lm_head.weight.dtype))
    config["dtype"] = str(head).removeprefix("torch.")
    parts = [(disk_name, part.numel() * part.element_size()) for name, shape, dtype in specs
             for disk_name, _, part in to_disk_layout(name, torch.empty(shape, dtype=dtype, device="meta"))]
    plan = list(byte_batches(parts, lambda p: p[1], max_shard_bytes)) or [[]]  # per file: names and sizes
    n = len(plan)
    files = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)] if n > 1 else ["model.safetensors"]
    file_after = {entries[-1][0]: file for file, entries in zip(files, plan) if entries}  # each file's last tensor
    with atomic_directory(out_dir, "model", inputs, overwrite=overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        shard: dict[str, torch.Tensor] = {}
        for (name, shape, _), (got, tensor) in zip(specs, tensors, strict=True):
            if got != name or tuple(tensor.shape) != shape:
                raise RuntimeError(f"write_model_dir: expected {name} {shape}, got {got} {tuple(tensor.shape)}")
            for disk_name, _, part in to_disk_layout(name, tensor.detach()):
                part = part.cpu()
                if not part.is_contiguous() or part.untyped_storage().nbytes() > part.nbytes:  # copied: frees its base
                    part = part.clone(memory_format=torch.contiguous_format)
                shard[disk_name] = part
                if disk_name in file_after:
                    _save_shard(shard, tmp / file_after[disk_name])
                    shard = {}
            del tensor, part  # free it before the next tensor is gathered
        if n > 1:
            weight_map = {name: file for file, entries in zip(files, plan) for name, _ in entries}
            index = {"metadata": {"total_size": sum(nbytes for _, nbytes in parts)}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        for name in TOKENIZER_FILES:
            if tokenizer_from and (Path(tokenizer_from) / name).is_file():
                shutil.copy2(Path(tokenizer_from) / name, tmp / name)
    return out_dir
