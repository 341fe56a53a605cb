"""Shard token ids -> model token ids: the identity for a preset or a directory without `tokenizer.json`
and < 256 ids (trained on shard ids), else each symbol's single-character token in `tokenizer.json`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from genome_lm.errors import GenomeLMError
from genome_lm.model.presets import is_preset, preset_config

SMALL_VOCAB = 256
SHARD_IDS = 256  # shard tokens are uint8


def token_map(shard_vocab: dict[str, int], model_source: str | Path, vocab_size: int | None = None) -> torch.Tensor:
    """LongTensor `m[shard_id] = model_id` for `shard_vocab` ({"A": 0, ..., "N": 4}) and what `build` was
    given; ids are checked against `vocab_size` (default: the source's)."""
    ids = sorted(shard_vocab.values())
    if ids != list(range(len(ids))):
        raise GenomeLMError(f"token map: shard vocabulary ids must be 0..{len(ids) - 1}, got {shard_vocab}")
    symbols = sorted(shard_vocab, key=shard_vocab.__getitem__)
    source = Path(str(model_source))
    mapping = list(range(len(symbols)))  # the identity: a model trained on shard ids
    if is_preset(str(model_source)):
        vocab_size = vocab_size or preset_config(str(model_source)).vocab_size
    elif (source / "tokenizer.json").is_file():
        from tokenizers import Tokenizer  # ships with transformers

        try:
            tok = Tokenizer.from_file(str(source / "tokenizer.json"))
            found = [tok.token_to_id(s) for s in symbols]
        except Exception as e:
            raise GenomeLMError(f"token map: cannot read tokenizer {source / 'tokenizer.json'}: {e}") from None
        if missing := [s for s, i in zip(symbols, found) if i is None]:
            raise GenomeLMError(f"token map: {source / 'tokenizer.json'} has no single-character token for {missing}; "
                                "use a GLM tokenizer or a model trained on shard ids")
        mapping = [i for i in found if i is not None]  # all of them: none is missing
    elif source.is_dir():
        if not vocab_size:
            try:
                raw = json.loads((source / "config.json").read_text())
                vocab_size = raw.get("vocab_size", (raw.get("text_config") or {}).get("vocab_size"))
            except OSError:
                vocab_size = None
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise GenomeLMError(f"token map: {source / 'config.json'} is not JSON ({e}); point to a model "
                                    "directory written by genome-lm (or save_pretrained)") from None
        if vocab_size is None or vocab_size >= SMALL_VOCAB:
            raise GenomeLMError(f"token map: {source} has no tokenizer.json and a {vocab_size}-id vocabulary; "
                                "copy the GLM tokenizer.json into it")
    else:
        raise GenomeLMError(f"token map: {model_source!r} is neither a preset nor a directory")
    if vocab_size is not None and max(mapping) >= vocab_size:
        raise GenomeLMError(f"token map: model id {max(mapping)} does not fit the model's {vocab_size}-id vocabulary; "
                            f"raise vocab_size (the shard vocabulary has {len(symbols)} symbols)")
    return torch.tensor(mapping, dtype=torch.long)


def token_lut(shard_vocab: dict[str, int], model_source: str | Path) -> np.ndarray:
    """`token_map` padded to int64 [256], one entry per uint8 shard id (0 past the vocabulary)."""
    mapped = token_map(shard_vocab, model_source).numpy()
    return np.pad(mapped, (0, SHARD_IDS - len(mapped)))
