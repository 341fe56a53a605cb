"""The model's weights on disk (Hugging Face safetensors): one key layout, one reader, one writer.

Directories read (safetensors only; pickled `.bin`/`.pt` files are never loaded):
- a full GLM-5.3-Flash checkpoint: `config.json` of `Glm5NextConfig` (`text_config` inside, or
  the flat text fields at top level), weights `model.language_model.*` + `lm_head.weight`,
  plus vision (`model.visual.*`) and MTP (`layers.{L}.*` beyond the last layer, `shared_head`,
  `eh_proj`, `enorm`, `hnorm`) weights, which are skipped;
- a text-only directory (`Glm5NextTextConfig`, keys `model.*` + `lm_head.weight`), as
  `save_pretrained` writes it, or a bare text model's keys (`layers.*`, `embed_tokens.*`).

Keys are in the on-disk layout real checkpoints use, or in upstream's module names (both are
read); upstream converts at load time (`transformers.conversion_mapping`, "glm5_next"):

    on disk (per layer)                          upstream module
    self_attn.{f_a_proj,f_b_proj,dt_bias,A_log}  self_attn.forget_gate.{...}
    hc_{attn,ffn}_{fn,base,scale}                {attn,ffn}_hc.{fn,base,scale}
    self_attn.{q,k,v}_conv1d.weight [Q, 1, K]    self_attn.conv1d.weight [3Q, 1, K] (concat)
    mlp.experts.{e}.{gate,up}_proj.weight [I, D] mlp.experts.gate_up_proj [E, 2I, D] (stack, cat)
    mlp.experts.{e}.down_proj.weight [D, I]      mlp.experts.down_proj [E, D, I] (stack)

`to_disk_layout` maps an upstream tensor to its on-disk tensors (writing); `read_rows` assembles
any dim-0 slice of one from them (reading).

Reading, `load_weights_`: a meta-built model is allocated (`to_empty`) and each tensor filled with
the rows this rank holds, read with `get_slice(key)[a:b]` (`CheckpointReader`). Writing,
`save_pretrained`: streamed one tensor at a time into files planned up front. Who calls which,
and why not DCP's Hugging Face storage: docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from genome_lm.errors import GenomeLMError
from genome_lm.files import atomic_directory, umask
from genome_lm.model.presets import check_overrides
from genome_lm.model.upstream import KEEP_IN_FP32, Glm5NextConfig, Glm5NextTextConfig

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30
TensorSpec = tuple[str, tuple[int, ...], torch.dtype]  # upstream name, full shape, dtype
ReadRows = Callable[[str, tuple[int, ...], int, int], torch.Tensor]  # (name, full shape, start, stop) -> rows

# ---- key layout: on disk <-> upstream modules (names relative to the text model or the causal LM)

_RENAMES = (  # (on-disk, upstream), applied as plain substring replacements
    [(f"self_attn.{n}", f"self_attn.forget_gate.{n}") for n in ("f_a_proj.", "f_b_proj.", "dt_bias", "A_log")]
    + [(f"hc_{where}_{n}", f"{where}_hc.{n}") for where in ("attn", "ffn") for n in ("fn", "base", "scale")]
)


def _rename_to_disk(name: str) -> str:
    for disk, ours in _RENAMES:
        name = name.replace(ours, disk)
    return name


def to_disk_layout(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """One upstream tensor -> its on-disk tensors (views of it)."""
    if name.endswith(".mlp.experts.gate_up_proj"):
        prefix = name.removesuffix(".gate_up_proj")
        gate, up = tensor.chunk(2, dim=1)  # [E, I, D] each
        for e in range(tensor.shape[0]):
            yield f"{prefix}.{e}.gate_proj.weight", gate[e]
            yield f"{prefix}.{e}.up_proj.weight", up[e]
    elif name.endswith(".mlp.experts.down_proj"):
        prefix = name.removesuffix(".down_proj")
        for e in range(tensor.shape[0]):
            yield f"{prefix}.{e}.down_proj.weight", tensor[e]
    elif name.endswith(".self_attn.conv1d.weight"):
        prefix = name.removesuffix(".conv1d.weight")
        for qkv, part in zip("qkv", tensor.chunk(3, dim=0)):
            yield f"{prefix}.{qkv}_conv1d.weight", part
    else:
        yield _rename_to_disk(name), tensor


def read_rows(name: str, shape: tuple[int, ...], start: int, stop: int,
              get: Callable[[str, int, int, tuple[int, ...]], torch.Tensor]) -> torch.Tensor:
    """Rows `[start, stop)` (dim 0) of upstream tensor `name` of full `shape`, from on-disk tensors:
    the inverse of `to_disk_layout`, a slice at a time. `get(disk_name, lo, hi, disk_shape)` returns
    rows `[lo, hi)` of one on-disk tensor whose full shape must be `disk_shape`; only those behind
    the requested rows are asked for (experts `start..stop-1` of a stacked expert tensor, the
    q/k/v rows under a slice of the concatenated conv weight)."""
    rest = tuple(shape[1:])
    if name.endswith(".mlp.experts.gate_up_proj"):  # [E, 2I, D] from per-expert [I, D]
        prefix, half = name.removesuffix(".gate_up_proj"), (shape[1] // 2, *shape[2:])
        return torch.stack([
            torch.cat([get(f"{prefix}.{e}.{proj}.weight", 0, half[0], half) for proj in ("gate_proj", "up_proj")])
            for e in range(start, stop)
        ])
    if name.endswith(".mlp.experts.down_proj"):  # [E, D, I] from per-expert [D, I]
        prefix = name.removesuffix(".down_proj")
        return torch.stack([get(f"{prefix}.{e}.down_proj.weight", 0, rest[0], rest) for e in range(start, stop)])
    if name.endswith(".self_attn.conv1d.weight"):  # [3Q, 1, K] from q, k, v [Q, 1, K]
        prefix, q = name.removesuffix(".conv1d.weight"), shape[0] // 3
        parts = [get(f"{prefix}.{qkv}_conv1d.weight", max(start, i * q) - i * q, min(stop, (i + 1) * q) - i * q,
                     (q, *rest))
                 for i, qkv in enumerate("qkv") if max(start, i * q) < min(stop, (i + 1) * q)]
        return torch.cat(parts)
    return get(_rename_to_disk(name), start, stop, tuple(shape))


# ---- checkpoint directories ----------------------------------------------------------------

_VISION_PREFIXES = ("model.visual.", "visual.", "model.vision", "vision_tower.", "model.vision_tower.")
_MTP_PARTS = (".shared_head.", ".eh_proj.", ".enorm.", ".hnorm.")
_TEXT_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.",
                  "language_model.lm_head.": "lm_head."}  # a full checkpoint's text keys -> the causal LM's
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


@contextlib.contextmanager
def _reading(path: Path):
    try:
        yield
    except (OSError, SafetensorError, json.JSONDecodeError, KeyError) as e:
        raise GenomeLMError(f"model: cannot read {path}: {e}; re-download or re-save the checkpoint") from None


def read_text_config(ckpt_dir: str | Path, **overrides) -> Glm5NextTextConfig:
    """The text config of a checkpoint directory (full `Glm5NextConfig` or text config)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise GenomeLMError(
            f"model: {ckpt_dir} is neither a preset name nor a directory; use glm53-tiny, glm53-demo, glm53-mini, "
            "glm53-flash or a local Hugging Face checkpoint directory"
        )
    path = ckpt_dir / "config.json"
    if not path.is_file():
        raise GenomeLMError(f"model: {ckpt_dir} has no config.json; point model at a Hugging Face checkpoint directory")
    check_overrides(overrides)
    with _reading(path):
        raw = json.loads(path.read_text())
    model_type = raw.get("model_type")
    try:
        if model_type == "glm5_next":
            raw.pop("model_type")
            text = Glm5NextConfig.from_dict(raw).text_config.to_dict()
        elif model_type == "glm5_next_text":
            text = raw
        else:
            raise GenomeLMError(
                f"model: {path} has model_type {model_type!r}; expected a GLM-5.3-Flash checkpoint "
                "(model_type glm5_next or glm5_next_text)"
            )
        text = {k: v for k, v in text.items() if k not in ("model_type", "transformers_version", "architectures")}
        text.update(overrides)
        return Glm5NextTextConfig(**text)
    except (TypeError, ValueError, StrictDataclassError) as e:
        raise GenomeLMError(f"model: invalid text config in {path}: {e}") from None


def safetensors_files(ckpt_dir: str | Path) -> list[Path]:
    """The safetensors shards of a directory (index first, then `model.safetensors`, then `*.safetensors`)."""
    ckpt_dir = Path(ckpt_dir)
    index = ckpt_dir / "model.safetensors.index.json"
    if index.is_file():
        with _reading(index):
            weight_map = json.loads(index.read_text())["weight_map"]
        files = [ckpt_dir / name for name in sorted(set(weight_map.values()))]
        if missing := [f.name for f in files if not f.is_file()]:
            raise GenomeLMError(
                f"model: {index} lists shards missing from {ckpt_dir}: {missing[:5]}; finish the download"
            )
        return files
    if (ckpt_dir / "model.safetensors").is_file():
        return [ckpt_dir / "model.safetensors"]
    if files := sorted(ckpt_dir.glob("*.safetensors")):
        return files
    pickles = [p.name for pat in _PICKLES for p in ckpt_dir.glob(pat)]
    hint = f" (found {pickles[:3]}: pickled weights are never loaded; convert them to safetensors)" if pickles else ""
    raise GenomeLMError(f"model: no *.safetensors weights in {ckpt_dir}{hint}")


def text_key(key: str, num_layers: int) -> str | None:
    """Checkpoint key -> causal-LM key (`model.*`, `lm_head.weight`), or None to skip (vision, MTP)."""
    if key.startswith((*_VISION_PREFIXES, "mtp.", "model.mtp.")):
        return None
    if prefix := next((p for p in _TEXT_PREFIXES if key.startswith(p)), None):
        key = _TEXT_PREFIXES[prefix] + key.removeprefix(prefix)
    elif not key.startswith(("model.", "lm_head.")):
        key = "model." + key  # a bare text model's keys
    if any(part in key for part in _MTP_PARTS):
        return None
    if (m := _LAYER.match(key)) and int(m.group(1)) >= num_layers:
        return None
    return key


def keep_fp32(name: str) -> bool:
    """Parameters upstream keeps in float32 under bf16/fp16 (`_keep_in_fp32_modules_strict`)."""
    return any(pattern in name for pattern in KEEP_IN_FP32)


def cast_tensor(name: str, tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`tensor` in `dtype` unless upstream keeps `name` in float32 (dtype None: as stored)."""
    if dtype is None or not tensor.is_floating_point():
        return tensor
    if keep_fp32(name) and dtype in (torch.float16, torch.bfloat16):
        return tensor.to(torch.float32)
    return tensor.to(dtype)


# ---- reading -------------------------------------------------------------------------------


class CheckpointReader:
    """Dim-0 slices of the text model's tensors (upstream names) from a checkpoint directory.

        with CheckpointReader(ckpt_dir, model.config) as reader:
            stored, unused = reader.check({"model.norm.weight": (64,), ...})  # all present, shapes right
            rows = reader.rows("model.layers.1.mlp.experts.down_proj", (8, 64, 32), 3, 6)  # experts 3..5

    A tensor stored under its upstream name is sliced directly; otherwise its rows are assembled
    from the on-disk tensors behind them (`read_rows`). Only the rows asked for are read
    (`get_slice(key)[start:stop]` on the memory-mapped file); at most `OPEN_FILES` files stay
    mapped, so the pages read leave the resident set once the reader moves on. Vision and MTP
    weights, and layers beyond `config.num_hidden_layers`, are not indexed. GenomeLMError on
    missing tensors (all listed at once by `check`) or a shape that does not match the config.
    """

    OPEN_FILES = 2

    def __init__(self, ckpt_dir: str | Path, config: Glm5NextTextConfig):
        self.dir = Path(ckpt_dir)
        self.files = safetensors_files(self.dir)
        self._where: dict[str, tuple[Path, str, tuple[int, ...], str]] = {}  # key -> (file, its key, shape, dtype)
        self._open: OrderedDict[Path, safe_open] = OrderedDict()
        for path in self.files:
            with _reading(path), safe_open(str(path), framework="pt", device="cpu") as f:
                for key in f.keys():
                    if (name := text_key(key, config.num_hidden_layers)) is not None:
                        part = f.get_slice(key)
                        self._where[name] = (path, key, tuple(part.get_shape()), part.get_dtype())

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        while self._open:
            self._open.popitem()[1].__exit__(None, None, None)

    def _file(self, path: Path) -> safe_open:
        if path in self._open:
            self._open.move_to_end(path)
        else:
            while len(self._open) >= self.OPEN_FILES:
                self._open.popitem(last=False)[1].__exit__(None, None, None)
            with _reading(path):
                self._open[path] = safe_open(str(path), framework="pt", device="cpu")
        return self._open[path]

    def _stored(self, key: str, shape: tuple[int, ...]) -> tuple[Path, str, str] | None:
        """(file, its key, dtype) of checkpoint tensor `key`, None if absent; an error if not of `shape`."""
        if key not in self._where:
            return None
        path, file_key, stored, dtype = self._where[key]
        if stored != tuple(shape):
            raise GenomeLMError(f"model: {path}: {file_key} has shape {stored}, the config expects {tuple(shape)}; "
                                "check config.json and the config overrides")
        return path, file_key, dtype

    def get(self, key: str, start: int, stop: int, shape: tuple[int, ...]) -> torch.Tensor:
        """Rows `[start, stop)` of the checkpoint tensor stored as `key` (causal-LM key in the file's
        own layout), whose full shape must be `shape`."""
        if (found := self._stored(key, shape)) is None:
            self._missing([key])
        path, file_key, _ = found
        with _reading(path):
            return self._file(path).get_slice(file_key)[start:stop]

    def rows(self, name: str, shape: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
        """Rows `[start, stop)` of the model's tensor `name` (upstream causal-LM name, full `shape`)."""
        if name in self._where:
            return self.get(name, start, stop, shape)
        return read_rows(name, shape, start, stop, self.get)

    def check(self, tensors: dict[str, tuple[int, ...]]) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Before reading anything: every checkpoint tensor behind the model tensors `tensors` (name ->
        full shape) exists with the right shape. Returns what each of them is as stored (a tensor on
        the meta device: shape, dtype) and the checkpoint's text keys that none of them uses."""
        needed, missing = set(), []

        def visit(key: str, start: int, stop: int, shape: tuple[int, ...]) -> torch.Tensor:
            found = self._stored(key, shape)
            if found is None:
                missing.append(key)
            else:
                needed.add(key)
            dtype = None if found is None else _DTYPES[found[2]]
            return torch.empty((stop - start, *shape[1:]), dtype=dtype, device="meta")

        stored = {name: visit(name, 0, shape[0], shape) if name in self._where else
                  read_rows(name, shape, 0, shape[0], visit) for name, shape in tensors.items()}
        if missing:
            self._missing(missing)
        return stored, sorted(set(self._where) - needed)

    def _missing(self, keys: list[str]):
        raise GenomeLMError(
            f"model: {self.dir} lacks {len(keys)} weight(s) of the text model, e.g. {keys[:5]}; is it a GLM-5.3-Flash "
            "checkpoint matching its config.json (and the config overrides), with all its weights files?"
        )


def local_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the part of `tensor` this rank holds, its first row in the full tensor); (tensor, 0) for a
    plain tensor. Sharded tensors must be split on dim 0 only: FSDP2's `Shard(0)`, and with expert
    parallelism the experts' `Shard(0)` over "ep" then FSDP2's `_StridedShard(0)` over "edp"
    (torch.chunk sizes: each split takes ceil(rows / n) rows)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(tensor, DTensor):
        return tensor, 0
    placements = tensor.placements
    if not all(isinstance(p, Replicate) or (isinstance(p, (Shard, _StridedShard)) and p.dim == 0) for p in placements):
        raise ValueError(f"local_rows: only dim-0 sharding is supported, got {placements}")
    coordinate = tensor.device_mesh.get_coordinate()
    rows, offset = tensor.shape[0], 0
    shards = [i for i, p in enumerate(placements) if isinstance(p, Shard)]
    for i in shards + [i for i, p in enumerate(placements) if isinstance(p, _StridedShard)]:  # strided: applied last
        chunk = -(-rows // tensor.device_mesh.size(i))
        offset += coordinate[i] * chunk
        rows = max(0, min(chunk, rows - coordinate[i] * chunk))
    return tensor.to_local(), offset


def _allocate_(model: nn.Module, device: str | torch.device) -> None:
    """`to_empty`: every tensor is filled afterwards from the state dict, so a non-persistent buffer
    would be lost (the model has none; refused). `to_empty` unties a plain model's tied `lm_head`."""
    from torch.distributed.tensor import DTensor

    lost = [f"{p}.{n}".lstrip(".") for p, module in model.named_modules() for n in module._non_persistent_buffers_set]
    if lost:
        raise NotImplementedError(f"load_weights_: non-persistent buffers {lost[:3]} would be left uninitialised by "
                                  "to_empty; recompute them here")
    model.to_empty(device=device)
    embed = model.model.embed_tokens.weight
    if model.config.tie_word_embeddings and model.lm_head.weight is not embed:
        if isinstance(embed, DTensor):
            raise GenomeLMError("model: tie_word_embeddings is not supported in distributed runs; set "
                                "model.overrides.tie_word_embeddings: false")
        model.lm_head.weight = embed


@torch.no_grad()
def load_weights_(model: nn.Module, source: str | Path | Mapping[str, torch.Tensor],
                  device: str | torch.device | None = None, dtype: torch.dtype | None | str = "built") -> nn.Module:
    """Fill the tensors of `model.state_dict()` (a tied `lm_head.weight` is the embedding) from
    `source`, a model directory (`CheckpointReader`) or a plain model's full state dict, in place,
    one tensor at a time, each with the rows this rank holds (`local_rows`). Returns `model`.

    device: allocate `model`, built on the meta device (sharded or not), there first (`to_empty`).
    dtype: "built": the rows are rounded to the dtype the model was built in (`model.config.dtype`,
    upstream's float32 exceptions kept), so float32 master weights of a bf16 model hold what one
    process's bf16 model holds, and tensors keep their dtypes; a dtype or None (`build(dir)`): a
    meta model's tensors take the checkpoint's dtypes cast to it (`cast_tensor`; None: as stored).
    Missing weights and shapes that do not match are GenomeLMErrors, found before anything is read;
    checkpoint weights the model has no place for are logged and kept in `model.load_report`."""
    as_stored = not isinstance(dtype, str)
    if not as_stored:
        dtype = model.config.dtype if isinstance(model.config.dtype, torch.dtype) else None
    with contextlib.ExitStack() as stack:
        if isinstance(source, Mapping):
            stored, unused, progress = source, [], False

            def read(name: str, shape: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
                return source[name][start:stop]
        else:
            reader = stack.enter_context(CheckpointReader(source, model.config))
            stored, unused = reader.check({name: tuple(t.shape) for name, t in model_tensors(model).items()})
            read, progress = reader.rows, as_stored and len(reader.files) > 1 and f"loading {Path(source).name}"
        if unused:
            log.warning("%s: %d weights not used by the model, e.g. %s", source, len(unused), unused[:5])
        if device is not None:
            if as_stored:
                for name, tensor in model_tensors(model, model.state_dict(keep_vars=True)).items():
                    tensor.data = torch.empty_like(tensor, dtype=cast_tensor(name, stored[name], dtype).dtype)
            _allocate_(model, device)
        tensors = model_tensors(model, model.state_dict(keep_vars=True)).items()
        for name, tensor in tqdm(tensors, desc=progress or None, unit="tensor", disable=not progress):
            local, start = local_rows(tensor)
            if local.dim() == 0:
                raise ValueError(f"load_weights_: {name} is a scalar; the model has none")
            if local.shape[0] == 0:
                continue  # this rank holds no rows of a tensor shorter than the world
            rows = cast_tensor(name, read(name, tuple(tensor.shape), start, start + local.shape[0]), dtype)
            if rows.shape != local.shape:
                raise GenomeLMError(f"model: {name}: got rows of shape {tuple(rows.shape)}, expected "
                                    f"{tuple(local.shape)}; the checkpoint does not match the model's config")
            local.copy_(rows)
    model.load_report = {"missing": [], "unexpected": unused}
    return model


# ---- writing -------------------------------------------------------------------------------


def model_tensors(model: nn.Module, state_dict: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The tensors read and written, under upstream names, in writing order: `model.state_dict()`
    (or `state_dict`) without a tied `lm_head.weight`. Sharded (DTensor) entries stay sharded."""
    state = dict(model.state_dict() if state_dict is None else state_dict)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def byte_batches(items: Iterable, nbytes: Callable[[object], int], max_bytes: int) -> Iterator[list]:
    """`items` in order, in consecutive batches: a batch is closed when the next item would take it
    past `max_bytes` (a single larger item gets a batch of its own)."""
    batch, size = [], 0
    for item in items:
        if batch and size + nbytes(item) > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += nbytes(item)
    if batch:
        yield batch


def shard_plan(specs: Iterable[TensorSpec], max_bytes: int) -> list[list[tuple[str, int]]]:
    """The output files before anything is gathered: per file, its on-disk tensor names and sizes,
    in writing order, in files of at most `max_bytes` (`byte_batches`). Computed on the meta device."""
    parts = [(disk_name, part.numel() * part.element_size()) for name, shape, dtype in specs
             for disk_name, part in to_disk_layout(name, torch.empty(shape, dtype=dtype, device="meta"))]
    return list(byte_batches(parts, lambda p: p[1], max_bytes)) or [[]]


def shard_file_names(n: int) -> list[str]:
    """`model.safetensors` for one file, else `model-0000k-of-0000n.safetensors` (Hugging Face's names)."""
    return ["model.safetensors"] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


class ShardWriter:
    """Writes on-disk tensors, as they arrive in plan order, into the files of a `shard_plan`.

    A file is written, and its tensors dropped, as soon as its last tensor arrives, so the writer
    holds at most one file plus the rest of the parts of the tensor being added (`peak_bytes`
    records the most it held). Parts that are views into a larger tensor are copied, so the full
    tensor they came from can be freed. `finish()` writes `model.safetensors.index.json` when the
    plan has several files."""

    def __init__(self, directory: Path, plan: list[list[tuple[str, int]]]):
        self.directory, self.plan, self.names = Path(directory), plan, shard_file_names(len(plan))
        self.file_of = {name: i for i, entries in enumerate(plan) for name, _ in entries}
        self.left = [len(entries) for entries in plan]
        self.buffer: dict[str, torch.Tensor] = {}
        self.buffered_bytes = self.peak_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name not in self.file_of or name in self.buffer:
            raise RuntimeError(f"ShardWriter: {name} is not (or no longer) expected by the plan")
        part = tensor.detach().cpu()
        if not part.is_contiguous() or part.untyped_storage().nbytes() > part.nbytes:
            part = part.contiguous() if not part.is_contiguous() else part.clone()
        self.buffer[name] = part
        self.buffered_bytes += part.nbytes
        self.peak_bytes = max(self.peak_bytes, self.buffered_bytes)
        i = self.file_of[name]
        self.left[i] -= 1
        if self.left[i] == 0:
            self._flush(i)

    def _flush(self, i: int) -> None:
        shard = {name: self.buffer.pop(name) for name, _ in self.plan[i]}
        path = self.directory / self.names[i]
        try:
            save_file(shard, str(path), metadata={"format": "pt"})
        except SafetensorError as e:  # an I/O failure comes back as "... (os error N)": raise it as the OSError
            code = re.search(r"\(os error (\d+)\)", str(e))
            if code is None:
                raise
            raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from None
        os.chmod(path, 0o666 & ~umask())  # safetensors writes 0600; a shared group reads what the umask allows
        self.buffered_bytes -= sum(t.nbytes for t in shard.values())

    def finish(self) -> None:
        if missing := [name for i, entries in enumerate(self.plan) if self.left[i] for name, _ in entries
                       if name not in self.buffer]:
            raise RuntimeError(f"ShardWriter: never received {missing[:5]}")
        if len(self.plan) > 1:
            weight_map = {name: self.names[i] for i, entries in enumerate(self.plan) for name, _ in entries}
            total = sum(nbytes for entries in self.plan for _, nbytes in entries)
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (self.directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def save_pretrained(model: nn.Module, out_dir: str | Path, *, overwrite: bool = False,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                    state_dict: Mapping[str, torch.Tensor] | None = None, write: bool = True,
                    dtype: torch.dtype | None = None) -> Path:
    """Write `model` (a `Glm5NextCausalLM`) to `out_dir` as a Hugging Face-style text-only directory:

    - `config.json`: the upstream `Glm5NextTextConfig` (`model_type: glm5_next_text`), `dtype` set;
    - `model.safetensors` (or `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json`
      past `max_shard_bytes`): keys `model.*` and `lm_head.weight` in the on-disk layout;
    - tokenizer files copied from the source checkpoint, when it had them (`token_map`).

    `Glm5NextTextModel.from_pretrained(dir)` loads it (`lm_head.weight` reported unused), and
    `build(dir)` rebuilds the causal LM identically. Atomic (`atomic_directory`): an existing
    `out_dir` is an error, or with `overwrite` replaced once the new one is complete.
    `state_dict`: the tensors to write, if not `model.state_dict()`. `dtype`: write the weights in
    this dtype (upstream's float32 exceptions kept float32, `cast_tensor`), e.g. a bf16 model's
    float32 master weights as bf16; None: as they are.

    Streamed: tensors are taken one at a time, converted to the on-disk layout and written into
    files planned up front from their shapes (`shard_plan`), each file as soon as it is complete;
    memory beyond the model: about one file plus one tensor. A sharded (FSDP2) model is gathered
    one tensor at a time: the call is then collective, every rank calls it, and only the rank
    with `write=True` writes (the others return once their part is done).
    """
    from torch.distributed.tensor import DTensor

    tensors = model_tensors(model, state_dict)
    for name, tensor in tensors.items():
        if tensor.is_meta:
            raise GenomeLMError(f"model: cannot save a model built on the meta device ({name} has no data)")
    specs = [(name, tuple(t.shape), cast_tensor(name, torch.empty(0, dtype=t.dtype), dtype).dtype)
             for name, t in tensors.items()]
    gathered = ((name, cast_tensor(name, t.full_tensor() if isinstance(t, DTensor) else t, dtype))
                for name, t in tensors.items())
    if not write:
        for _ in gathered:
            pass
        return Path(out_dir)
    return write_model_dir(model, out_dir, specs, gathered, overwrite=overwrite, max_shard_bytes=max_shard_bytes)


def write_model_dir(model: nn.Module, out_dir: str | Path, specs: list[TensorSpec],
                    tensors: Iterable[tuple[str, torch.Tensor]], *, overwrite: bool = False,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, inputs: Iterable[str | Path] = ()) -> Path:
    """The directory of `save_pretrained` from full tensors that arrive one at a time, in the order
    of `specs` (upstream name, shape, dtype: what the files are planned from). `model` gives the
    config (it may be on the meta device) and the source of tokenizer files; `inputs` (what the
    weights were read from) may not lie inside `out_dir` (`outputs.claim_output`)."""
    out_dir = Path(out_dir)
    config = model.config.to_dict()
    config["architectures"] = ["Glm5NextTextModel"]
    dtypes = {name: dtype for name, _, dtype in specs}
    head = dtypes.get("lm_head.weight", dtypes.get("model.embed_tokens.weight", model.lm_head.weight.dtype))
    config["dtype"] = str(head).removeprefix("torch.")
    plan = shard_plan(specs, max_shard_bytes)
    with atomic_directory(out_dir, "model", inputs, overwrite=overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        writer = ShardWriter(tmp, plan)
        for (name, shape, _), (got, tensor) in zip(specs, tensors, strict=True):
            if got != name or tuple(tensor.shape) != shape:
                raise RuntimeError(f"write_model_dir: expected {name} {shape}, got {got} {tuple(tensor.shape)}")
            for disk_name, part in to_disk_layout(name, tensor.detach()):
                writer.add(disk_name, part)
            tensor = part = None  # free it before the next tensor is gathered
        writer.finish()
        source = getattr(model, "source", None)
        if source and Path(source).is_dir():
            for name in TOKENIZER_FILES:
                if (Path(source) / name).is_file():
                    shutil.copy2(Path(source) / name, tmp / name)
    return out_dir
