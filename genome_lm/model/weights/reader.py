"""Reading the model's weights: a checkpoint directory's config and safetensors, and
`load_weights_`, which fills a model in place with the rows each rank holds.

Directories read (safetensors only; pickled `.bin`/`.pt` files are never loaded):
- a full GLM-5.3-Flash checkpoint: `config.json` of `Glm5NextConfig` (`text_config` inside, or
  the flat text fields at top level), weights `model.language_model.*` + `lm_head.weight`,
  plus vision (`model.visual.*`) and MTP (`layers.{L}.*` beyond the last layer, `shared_head`,
  `eh_proj`, `enorm`, `hnorm`) weights, which are skipped;
- a text-only directory (`Glm5NextTextConfig`, keys `model.*` + `lm_head.weight`), as
  `writer.save_pretrained` writes it, or a bare text model's keys (`layers.*`, `embed_tokens.*`).

`load_weights_`: a meta-built model is allocated (`to_empty`) and each tensor filled with the rows
this rank holds, read with `get_slice(key)[a:b]` (`CheckpointReader`), in the key layout of
`layout.py`. Who calls it, and why not DCP's Hugging Face storage: docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, NoReturn

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from tqdm import tqdm
from transformers import PreTrainedConfig

from genome_lm.errors import GenomeLMError
from genome_lm.model.presets import check_overrides
from genome_lm.model.upstream import Glm5NextConfig, Glm5NextTextConfig
from genome_lm.model.weights.layout import cast_tensor, model_tensors, read_rows, text_key

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadReport:
    """What `load_weights_` found besides the model's tensors: `unexpected`, the checkpoint's text
    weights the model has no place for (logged). Missing weights are an error, so none are listed."""

    unexpected: tuple[str, ...] = ()

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
            text_config = Glm5NextConfig.from_dict(raw).text_config
            assert isinstance(text_config, PreTrainedConfig)  # the config builds its text config from the dict
            text = text_config.to_dict()
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

    def _missing(self, keys: list[str]) -> NoReturn:
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
        assert coordinate is not None  # the tensor is sharded over a mesh that holds this rank
        chunk = -(-rows // tensor.device_mesh.size(i))
        offset += coordinate[i] * chunk
        rows = max(0, min(chunk, rows - coordinate[i] * chunk))
    return tensor.to_local(), offset


def _allocate_(model: Glm5NextCausalLM, device: str | torch.device) -> None:
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
def load_weights_(model: Glm5NextCausalLM, source: str | Path | Mapping[str, torch.Tensor],
                  device: str | torch.device | None = None, *, dtype: torch.dtype | None,
                  stored_dtypes: bool = False) -> LoadReport:
    """Fill the tensors of `model.state_dict()` (a tied `lm_head.weight` is the embedding) from
    `source`, a model directory (`CheckpointReader`) or a plain model's full state dict, in place,
    one tensor at a time, each with the rows this rank holds (`local_rows`).

    device: allocate `model`, built on the meta device (sharded or not), there first (`to_empty`).
    dtype: the rows are rounded to it (`cast_tensor`: upstream's float32 exceptions kept; None: as
        read) before they are copied in. Pass the dtype the model was built in (`BuiltModel.dtype`),
        so float32 master weights of a bf16 model hold what one process's bf16 model holds.
    stored_dtypes: with `device`, the meta model's tensors first take the checkpoint's dtypes cast to
        `dtype` (what `build(dir)` does, with a progress bar over several files); False: every
        tensor keeps its dtype.
    Missing weights and shapes that do not match are GenomeLMErrors, found before anything is read.
    Returns the `LoadReport`: checkpoint weights the model has no place for (also logged)."""
    unused: list[str]
    progress: str | bool  # the progress bar's description, or False: none
    with contextlib.ExitStack() as stack:
        if isinstance(source, Mapping):
            stored, unused, progress = source, [], False

            def read(name: str, shape: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
                return source[name][start:stop]
        else:
            reader = stack.enter_context(CheckpointReader(source, model.config))
            stored, unused = reader.check({name: tuple(t.shape) for name, t in model_tensors(model).items()})
            read, progress = reader.rows, stored_dtypes and len(reader.files) > 1 and f"loading {Path(source).name}"
        if unused:
            log.warning("%s: %d weights not used by the model, e.g. %s", source, len(unused), unused[:5])
        if device is not None:
            if stored_dtypes:
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
    return LoadReport(tuple(unused))
