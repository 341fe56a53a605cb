"""Named text configs: the full-size GLM-5.3-Flash (upstream's defaults, ~313B, meta device only) and
three small models of its architecture: `glm53-mini` (~230M, one GPU, flash's DSA budget),
`glm53-tiny` (~0.5M, the tests': k-pool 4 < top-k 32, really sparse from a few hundred tokens) and
`glm53-demo` (~0.2M, `make demo`'s: DSA top-k 8192, dense up to 8k, as a from-scratch indexer is
untrained). Small presets use a 16-id vocabulary; any config field can be overridden. `token_map`: shard
token ids -> model token ids, the identity for a preset or a directory without `tokenizer.json` and < 256
ids (trained on shard ids), else each symbol's single-character token in `tokenizer.json`."""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub.errors import StrictDataclassError

from genome_lm.errors import GenomeLMError
from genome_lm.model.upstream import Glm5NextTextConfig

NUCLEOTIDE_VOCAB = 16
SMALL_VOCAB = 256
SHARD_IDS = 256  # shard tokens are uint8

_KDA, _DSA = "linear_attention", "indexed_attention"

PRESETS: dict[str, dict[str, Any]] = {
    "glm53-flash": {},
    "glm53-mini": dict(  # one line per part: vocabulary, widths, layers, MLA, indexer, experts
        vocab_size=NUCLEOTIDE_VOCAB, pad_token_id=None,
        hidden_size=768, intermediate_size=2048, moe_intermediate_size=384,
        num_hidden_layers=8,  # KDA on i % 4 != 3: DSA at layers 3 and 7
        num_attention_heads=8, num_key_value_heads=8, linear_num_heads=12, linear_head_dim=64,
        q_lora_rank=384, kv_lora_rank=256, qk_nope_head_dim=96, v_head_dim=96,
        index_n_heads=8, index_head_dim=64, index_topk=2048, index_kpool=16,
        n_routed_experts=32, num_experts_per_tok=4, n_shared_experts=1, mlp_layer_types=["dense"] + ["sparse"] * 7,
    ),
    "glm53-tiny": dict(
        vocab_size=NUCLEOTIDE_VOCAB, pad_token_id=None,
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=2, linear_num_heads=2, linear_head_dim=32,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32, v_head_dim=32,
        index_n_heads=2, index_head_dim=32, index_topk=32, index_kpool=4,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        layer_types=[_KDA, _KDA, _KDA, _DSA, _DSA, _KDA],
        indexer_types=["full", "full", "full", "full", "shared", "full"],
        mlp_layer_types=["dense"] + ["sparse"] * 5,
    ),
}

# glm53-tiny's widths and layer kinds, tuned so that in-context copying is learnable in minutes on a CPU
PRESETS["glm53-demo"] = dict(
    PRESETS["glm53-tiny"],
    num_hidden_layers=3, layer_types=[_KDA, _DSA, _DSA],
    num_attention_heads=4, num_key_value_heads=4, linear_num_heads=4, linear_conv_kernel_dim=8,
    index_topk=8192, indexer_types=["full", "full", "shared"],
    mlp_layer_types=["dense", "dense", "dense"],
)

# Presets too large to materialise on a CPU: `build` puts them on the meta device by default.
META_ONLY = {"glm53-flash"}


def check_overrides(overrides: dict[str, Any]) -> None:
    """One `GenomeLMError` line for a `model.overrides` key that is no `Glm5NextTextConfig` field."""
    fields = {f.name for f in dataclasses.fields(Glm5NextTextConfig)}
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=1)
            hint = f"did you mean {close[0]}?" if close else "give one, e.g. model.overrides.index_topk"
            raise GenomeLMError(f"model.overrides.{key}: not a field of Glm5NextTextConfig; {hint}")


def preset_config(name: str, **overrides: Any) -> Glm5NextTextConfig:
    """The upstream text config of preset `name` with `overrides`; per-layer lists are dropped when
    `num_hidden_layers` is overridden without them, a `pad_token_id` outside the vocabulary is None."""
    if name not in PRESETS:
        raise GenomeLMError(
            f"model: unknown preset {name!r}; use one of {', '.join(PRESETS)} or a checkpoint directory"
        )
    check_overrides(overrides)
    fields = dict(PRESETS[name])
    if "num_hidden_layers" in overrides:
        for key in ("layer_types", "indexer_types", "mlp_layer_types"):
            fields.pop(key, None)  # those given in overrides come back below
    fields.update(overrides)
    pad = fields.get("pad_token_id", Glm5NextTextConfig.pad_token_id)
    vocab = fields.get("vocab_size", Glm5NextTextConfig.vocab_size)
    if pad is not None and pad >= vocab:
        fields["pad_token_id"] = None
    try:
        return Glm5NextTextConfig(**fields)
    except (TypeError, ValueError, StrictDataclassError) as e:
        raise GenomeLMError(f"model: invalid config for preset {name!r} with overrides {overrides}: {e}") from None


def token_map(shard_vocab: dict[str, int], model_source: str | Path, vocab_size: int | None = None) -> torch.Tensor:
    """LongTensor `m[shard_id] = model_id` for `shard_vocab` ({"A": 0, ..., "N": 4}) and what `build` was
    given; ids are checked against `vocab_size` (default: the source's)."""
    ids = sorted(shard_vocab.values())
    if ids != list(range(len(ids))):
        raise GenomeLMError(f"token map: shard vocabulary ids must be 0..{len(ids) - 1}, got {shard_vocab}")
    symbols = sorted(shard_vocab, key=shard_vocab.__getitem__)
    source = Path(str(model_source))
    mapping = list(range(len(symbols)))  # the identity: a model trained on shard ids
    if str(model_source) in PRESETS:
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
