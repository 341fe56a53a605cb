"""Reading the model's weights (safetensors, never pickles) from a full GLM-5.3-Flash checkpoint (vision
and MTP skipped) or a text-only directory: `load_weights_` fills a model with the rows each rank holds."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from torch.distributed.checkpoint import DefaultLoadPlanner, HuggingFaceStorageReader
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from tqdm import tqdm
from transformers import PreTrainedConfig

from genome_lm.errors import GenomeLMError
from genome_lm.model.presets import check_overrides
from genome_lm.model.upstream import Glm5NextConfig, Glm5NextTextConfig
from genome_lm.model.weights.layout import cast_dtype, cast_tensor, model_tensors, text_key, to_disk_layout

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadReport:
    """`unexpected`: the checkpoint's text weights the model has no place for (missing ones are an error)."""

    unexpected: tuple[str, ...] = ()


@contextlib.contextmanager
def _reading(path: Path):
    try:
        yield
    except (OSError, SafetensorError, json.JSONDecodeError, KeyError) as e:
        raise GenomeLMError(f"model: cannot read {path}: {e}; re-download or re-save the checkpoint") from None


def read_text_config(ckpt_dir: str | Path, **overrides) -> Glm5NextTextConfig:
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
            raise GenomeLMError(f"model: {path} has model_type {model_type!r}; expected a GLM-5.3-Flash checkpoint "
                                "(model_type glm5_next or glm5_next_text)")
        drop = ("model_type", "transformers_version", "architectures")
        return Glm5NextTextConfig(**{k: v for k, v in text.items() if k not in drop} | overrides)
    except (TypeError, ValueError, StrictDataclassError) as e:
        raise GenomeLMError(f"model: invalid text config in {path}: {e}") from None


def safetensors_files(ckpt_dir: str | Path) -> list[Path]:
    """The `*.safetensors` of a directory (DCP reads them all), once every shard its index lists is there."""
    ckpt_dir = Path(ckpt_dir)
    index = ckpt_dir / "model.safetensors.index.json"
    if index.is_file():
        with _reading(index):
            weight_map = json.loads(index.read_text())["weight_map"]
        if missing := [name for name in sorted(set(weight_map.values())) if not (ckpt_dir / name).is_file()]:
            raise GenomeLMError(
                f"model: {index} lists shards missing from {ckpt_dir}: {missing[:5]}; finish the download"
            )
    if files := sorted(ckpt_dir.glob("*.safetensors")):
        return files
    pickles = [p.name for pat in ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl") for p in ckpt_dir.glob(pat)]
    hint = f" (found {pickles[:3]}: pickled weights are never loaded; convert them to safetensors)" if pickles else ""
    raise GenomeLMError(f"model: no *.safetensors weights in {ckpt_dir}{hint}")


class _RowsPlanner(DefaultLoadPlanner):
    """DCP reads straight into the model's tensors: `pieces` maps (checkpoint key, first row) to the view
    its rows go into and the dtype they are rounded to first (None: as stored)."""

    def __init__(self, pieces: dict[tuple[str, int], tuple[torch.Tensor, torch.dtype | None]]):
        super().__init__()
        self.pieces = pieces

    def _view(self, req: ReadItem) -> tuple[torch.Tensor, torch.dtype | None]:
        assert req.dest_index.offset is not None  # set for every read item of a chunk list
        view, dtype = self.pieces[req.dest_index.fqn, req.dest_index.offset[0]]
        return view[tuple(slice(o, o + n) for o, n in zip(req.dest_offsets, req.lengths))], dtype

    def resolve_tensor(self, req: ReadItem) -> torch.Tensor:
        view, dtype = self._view(req)
        return view if dtype is None else torch.empty_like(view, dtype=dtype)

    def commit_tensor(self, req: ReadItem, tensor: torch.Tensor) -> None:
        view, dtype = self._view(req)
        if dtype is not None:
            view.copy_(tensor)


class CheckpointReader:
    """The text model's tensors (upstream names) in a checkpoint directory, only the rows asked for, via
    DCP's `HuggingFaceStorageReader` (which reads every `*.safetensors`, not the index json) from the
    on-disk tensors behind them (`to_disk_layout`); GenomeLMError on a tensor stored twice."""

    def __init__(self, ckpt_dir: str | Path, config: Glm5NextTextConfig):
        self.dir = Path(ckpt_dir)
        self.files = safetensors_files(self.dir)
        self.storage = HuggingFaceStorageReader(str(self.dir))
        with _reading(self.dir):
            self.metadata = self.storage.read_metadata()
        self.storage.set_up_storage_reader(self.metadata, True)
        self.keys = {name: (key, stored) for key, stored in self.metadata.state_dict_metadata.items()
                     if isinstance(stored, TensorStorageMetadata)  # safetensors hold tensors only
                     and (name := text_key(key, config.num_hidden_layers)) is not None}
        if twice := [key for key, stored in self.keys.values() if len(stored.chunks) > 1]:
            raise GenomeLMError(f"model: {self.dir} holds {twice[0]} (and {len(twice) - 1} more) in more than one "
                                "*.safetensors file; remove the stray copies (every *.safetensors file there is read)")

    def _disk(self, name: str, tensor: torch.Tensor, start: int = 0,
              rows: int | None = None) -> Iterator[tuple[str, int, torch.Tensor]]:
        return iter([(name, start, tensor)]) if name in self.keys else to_disk_layout(name, tensor, start, rows)

    def check(self, tensors: dict[str, tuple[int, ...]]) -> tuple[dict[str, torch.dtype], list[str]]:
        """`tensors` (name -> full shape) all stored so, else GenomeLMError -> (stored dtype by name, unused keys)."""
        needed, missing, dtypes = set(), [], {}
        for name, shape in tensors.items():
            for disk, _, part in self._disk(name, torch.empty(shape, device="meta")):
                if disk not in self.keys:
                    missing.append(disk)
                    continue
                needed.add(disk)
                key, stored = self.keys[disk]
                if (size := tuple(stored.size)) != tuple(part.shape):
                    path = next(info.relative_path for at, info in self.metadata.storage_data.items() if at.fqn == key)
                    raise GenomeLMError(f"model: {path}: {key} has shape {size}, the config expects "
                                        f"{tuple(part.shape)}; check config.json and the config overrides")
                dtypes[name] = stored.properties.dtype
        if missing:
            raise GenomeLMError(f"model: {self.dir} lacks {len(missing)} weight(s) of the text model, e.g. "
                                f"{missing[:5]}; is it a GLM-5.3-Flash checkpoint matching its config.json (and the "
                                "config overrides), with all its weights files?")
        return dtypes, sorted(set(self.keys) - needed)

    def read_(self, name: str, local: torch.Tensor, start: int, rows: int, dtype: torch.dtype | None) -> None:
        """Rows `[start, start + len(local))` of `name` (`rows` in all) into `local`, via `cast_dtype`."""
        pieces: dict[tuple[str, int], tuple[torch.Tensor, torch.dtype | None]] = {}
        items = []
        for disk, row, view in self._disk(name, local, start, rows):
            key, stored = self.keys[disk]
            cast = cast_dtype(name, stored.properties.dtype, dtype)
            pieces[key, row] = (view, None if dtype is None or cast in (stored.properties.dtype, view.dtype) else cast)
            chunk = ChunkStorageMetadata(offsets=torch.Size((row, *[0] * (view.dim() - 1))), sizes=view.shape)
            items += create_read_items_for_chunk_list(key, stored, [chunk])
        with _reading(self.dir):
            self.storage.read_data(LoadPlan(items), _RowsPlanner(pieces)).wait()


def local_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(this rank's part of `tensor`, its first row). Dim-0 sharding only: FSDP2's `Shard(0)`, under EP
    `Shard(0)` over "ep" and `_StridedShard(0)` over "edp"; DCP's chunk of the DTensor gives the row."""
    if not isinstance(tensor, DTensor):
        return tensor, 0
    placements = tensor.placements
    if not all(isinstance(p, Replicate) or (isinstance(p, (Shard, _StridedShard)) and p.dim == 0) for p in placements):
        raise ValueError(f"local_rows: only dim-0 sharding is supported, got {placements}")
    return tensor.to_local(), tensor.__create_chunk_list__()[0].offsets[0]


@torch.no_grad()
def load_weights_(model: Glm5NextCausalLM, source: str | Path | Mapping[str, torch.Tensor],
                  device: str | torch.device | None = None, *, dtype: torch.dtype | None,
                  stored_dtypes: bool = False) -> LoadReport:
    """Fill `model`'s tensors in place, one at a time, with the rows this rank holds, from a model
    directory or a full state dict; missing weights and wrong shapes are found before any read.
    device: `to_empty` the meta-built model there first. dtype: round the rows to it (`cast_tensor`),
    the dtype the model was built in, so float32 masters of a bf16 model hold bf16 values.
    stored_dtypes: with `device`, tensors take the checkpoint's dtypes cast to `dtype` (`build(dir)`).
    """
    if not isinstance(source, Mapping):
        reader = CheckpointReader(source, model.config)
        dtypes, unused = reader.check({name: tuple(t.shape) for name, t in model_tensors(model).items()})
        read_, progress = reader.read_, stored_dtypes and len(reader.files) > 1 and f"loading {Path(source).name}"
    else:
        dtypes, unused, progress = {name: t.dtype for name, t in source.items()}, [], False

        def read_(name: str, local: torch.Tensor, start: int, rows: int, dtype: torch.dtype | None) -> None:
            local.copy_(cast_tensor(name, source[name][start:start + len(local)], dtype))
    if unused:
        log.warning("%s: %d weights not used by the model, e.g. %s", source, len(unused), unused[:5])
    if device is not None:
        if stored_dtypes:
            for name, tensor in model_tensors(model, model.state_dict(keep_vars=True)).items():
                tensor.data = torch.empty_like(tensor, dtype=cast_dtype(name, dtypes[name], dtype))
        # every tensor is filled below, so a non-persistent buffer would be left uninitialised (the model has none)
        lost = [f"{p}.{n}".lstrip(".") for p, m in model.named_modules() for n in m._non_persistent_buffers_set]
        if lost:
            raise NotImplementedError(f"load_weights_: non-persistent buffers {lost[:3]} would be left uninitialised "
                                      "by to_empty; recompute them here")
        model.to_empty(device=device)
        embed = model.model.embed_tokens.weight
        if model.config.tie_word_embeddings and model.lm_head.weight is not embed:  # to_empty unties them
            if isinstance(embed, DTensor):
                raise GenomeLMError("model: tie_word_embeddings is not supported in distributed runs; set "
                                    "model.overrides.tie_word_embeddings: false")
            model.lm_head.weight = embed
    tensors = model_tensors(model, model.state_dict(keep_vars=True)).items()
    for name, tensor in tqdm(tensors, desc=progress or None, unit="tensor", disable=not progress):
        local, start = local_rows(tensor)
        if local.shape[0]:  # else this rank holds no rows of a tensor shorter than the world
            read_(name, local, start, tensor.shape[0], dtype)
    return LoadReport(tuple(unused))
