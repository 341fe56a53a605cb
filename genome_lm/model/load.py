"""Read a local Hugging Face checkpoint directory: its text config and text-tower weights.

Accepted layouts (all safetensors; pickled `.bin`/`.pt` files are never loaded):
- a full GLM-5.3-Flash checkpoint: `config.json` of `Glm5NextConfig` (`text_config` inside, or
  the flat text fields at top level), weights `model.language_model.*` + `lm_head.weight`,
  plus vision (`model.visual.*`) and MTP (`layers.{L}.*` beyond the last layer, `shared_head`,
  `eh_proj`, `enorm`, `hnorm`) weights, which are skipped;
- a text-only directory (`Glm5NextTextConfig`, keys `model.*` + `lm_head.weight`), as written by
  `genome_lm.model.save_pretrained`, or a bare text model's keys (`layers.*`, `embed_tokens.*`).
Either key layout of `convert.py` (on-disk or upstream module names) is accepted.

Two ways in: `iter_text_tensors` streams whole tensors file by file (`build(dir)`);
`CheckpointReader` reads any dim-0 slice of one tensor at a time (`get_slice`: only those rows
are read), so a rank of a sharded model reads just its rows and a plain model is filled one
tensor at a time, never holding a second copy of the model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections import OrderedDict
from pathlib import Path
from typing import Iterator

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from genome_lm.errors import GenomeLMError
from genome_lm.model.convert import ModuleLayout, read_rows
from genome_lm.model.upstream import KEEP_IN_FP32, Glm5NextConfig, Glm5NextTextConfig

log = logging.getLogger(__name__)

_VISION_PREFIXES = ("model.visual.", "visual.", "model.vision", "vision_tower.", "model.vision_tower.")
_MTP_PARTS = (".shared_head.", ".eh_proj.", ".enorm.", ".hnorm.")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


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
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GenomeLMError(f"model: cannot read {path}: {e}; re-download or re-save the checkpoint") from None
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
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise GenomeLMError(f"model: cannot read {index}: {e}; re-download the checkpoint") from None
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
    if key.startswith(_VISION_PREFIXES):
        return None
    if key.startswith("model.language_model."):
        key = "model." + key.removeprefix("model.language_model.")
    elif key.startswith("language_model.model."):
        key = "model." + key.removeprefix("language_model.model.")
    elif key.startswith("language_model.lm_head."):
        key = key.removeprefix("language_model.")
    elif key.startswith("mtp.") or key.startswith("model.mtp."):
        return None
    elif not key.startswith(("model.", "lm_head.")):
        key = "model." + key  # a bare text model's keys
    if any(part in key for part in _MTP_PARTS):
        return None
    if (m := _LAYER.match(key)) and int(m.group(1)) >= num_layers:
        return None
    return key


def iter_text_tensors(
    ckpt_dir: str | Path, config: Glm5NextTextConfig, device: str | torch.device = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(causal-LM key in upstream layout, tensor)` shard by shard; skips vision and MTP.

    Raises GenomeLMError when a layer's experts or conv pieces are incomplete at the end.
    """
    layout = ModuleLayout(config.n_routed_experts)
    skipped = 0
    files = safetensors_files(ckpt_dir)
    for path in tqdm(files, desc=f"loading {Path(ckpt_dir).name}", unit="shard", disable=len(files) < 2):
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                keys = list(f.keys())
                for key in keys:
                    name = text_key(key, config.num_hidden_layers)
                    if name is None:
                        skipped += 1
                        continue
                    yield from layout.add(name, f.get_tensor(key))
        except (OSError, SafetensorError) as e:
            raise GenomeLMError(f"model: cannot read {path}: {e}; re-download or re-save the checkpoint") from None
    if pending := layout.pending():
        raise GenomeLMError(
            f"model: incomplete weights in {ckpt_dir}: {len(pending)} pieces lack siblings, e.g. {pending[:3]}"
        )
    log.info("read text weights from %s (%d vision/MTP tensors skipped)", ckpt_dir, skipped)


class CheckpointReader:
    """Dim-0 slices of the text model's tensors (upstream names) from a checkpoint directory.

        with CheckpointReader(ckpt_dir, model.config) as reader:
            unused = reader.check({"model.norm.weight": (64,), ...})  # all present, shapes right
            rows = reader.rows("model.layers.1.mlp.experts.down_proj", (8, 64, 32), 3, 6)  # experts 3..5

    A tensor stored under its upstream name is sliced directly; otherwise its rows are assembled
    from the on-disk pieces behind them (`convert.read_rows`: per-expert tensors, q/k/v convs).
    Only the rows asked for are read (`safe_open(...).get_slice(key)[start:stop]` on the
    memory-mapped file); at most `OPEN_FILES` files stay mapped, so the pages read leave the
    resident set once the reader moves on. Vision and MTP weights, and layers beyond
    `config.num_hidden_layers`, are not indexed. GenomeLMError on missing tensors (all listed at
    once by `check`) or a shape that does not match the config (naming the file and key).
    """

    OPEN_FILES = 2

    def __init__(self, ckpt_dir: str | Path, config: Glm5NextTextConfig):
        self.dir = Path(ckpt_dir)
        self._where: dict[str, tuple[Path, str, tuple[int, ...]]] = {}  # causal-LM key -> (file, key, shape)
        self._open: OrderedDict[Path, safe_open] = OrderedDict()
        for path in safetensors_files(self.dir):
            with self._reading(path), safe_open(str(path), framework="pt", device="cpu") as f:
                for key in f.keys():
                    if (name := text_key(key, config.num_hidden_layers)) is not None:
                        self._where[name] = (path, key, tuple(f.get_slice(key).get_shape()))

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].__exit__(None, None, None)

    @staticmethod
    @contextlib.contextmanager
    def _reading(path: Path):
        try:
            yield
        except (OSError, SafetensorError) as e:
            raise GenomeLMError(f"model: cannot read {path}: {e}; re-download or re-save the checkpoint") from None

    def _file(self, path: Path) -> safe_open:
        if path in self._open:
            self._open.move_to_end(path)
        else:
            while len(self._open) >= self.OPEN_FILES:
                self._open.popitem(last=False)[1].__exit__(None, None, None)
            with self._reading(path):
                self._open[path] = safe_open(str(path), framework="pt", device="cpu")
        return self._open[path]

    def _check(self, key: str, shape: tuple[int, ...]) -> tuple[Path, str]:
        if key not in self._where:
            raise KeyError(key)
        path, file_key, stored = self._where[key]
        if stored != tuple(shape):
            raise GenomeLMError(f"model: {path}: {file_key} has shape {stored}, the config expects {tuple(shape)}; "
                                "check config.json and the config overrides")
        return path, file_key

    def get(self, key: str, start: int, stop: int, shape: tuple[int, ...]) -> torch.Tensor:
        """Rows `[start, stop)` of the checkpoint tensor stored as `key` (causal-LM key in the file's
        own layout), whose full shape must be `shape`."""
        try:
            path, file_key = self._check(key, shape)
        except KeyError:
            self._missing([key])
        with self._reading(path):
            return self._file(path).get_slice(file_key)[start:stop]

    def rows(self, name: str, shape: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
        """Rows `[start, stop)` of the model's tensor `name` (upstream causal-LM name, full `shape`)."""
        if name in self._where:
            return self.get(name, start, stop, shape)
        return read_rows(name, shape, start, stop, self.get)

    def check(self, tensors: dict[str, tuple[int, ...]]) -> list[str]:
        """Before reading anything: every checkpoint tensor behind the model tensors `tensors`
        (name -> full shape) exists with the right shape. Returns the checkpoint's text keys that
        none of them uses."""
        needed, missing = set(), []

        def visit(key: str, start: int, stop: int, shape: tuple[int, ...]) -> torch.Tensor:
            try:
                self._check(key, shape)
                needed.add(key)
            except KeyError:
                missing.append(key)
            return torch.empty((stop - start, *shape[1:]), device="meta")

        for name, shape in tensors.items():
            if name in self._where:
                visit(name, 0, shape[0], shape)
            else:
                read_rows(name, shape, 0, shape[0], visit)
        if missing:
            self._missing(missing)
        return sorted(set(self._where) - needed)

    def _missing(self, keys: list[str]):
        raise GenomeLMError(
            f"model: {self.dir} lacks {len(keys)} weight(s) of the text model, e.g. {keys[:5]}; is it a GLM-5.3-Flash "
            "checkpoint matching its config.json (and the config overrides)?"
        )


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
