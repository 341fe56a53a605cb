"""Parameter counts by group (`_RULES`; `kda` / `mla`: the other self_attn.* of KDA / DSA layers), meta models too."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM
    from genome_lm.model.upstream import Glm5NextTextModel

GROUPS = ("embeddings", "lm_head", "kda", "mla", "indexer", "routed_experts", "shared_experts", "dense_mlp", "router",
          "hyper_connections", "norms", "other")

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_RULES = [  # (pattern on the name, group); first match wins
    (re.compile(r"(^|\.)embed_tokens\."), "embeddings"),
    (re.compile(r"^lm_head\."), "lm_head"),
    (re.compile(r"\.self_attn\.indexer\."), "indexer"),
    (re.compile(r"\.mlp\.experts\."), "routed_experts"),
    (re.compile(r"\.mlp\.shared_experts\."), "shared_experts"),
    (re.compile(r"\.mlp\.gate\."), "router"),
    (re.compile(r"\.mlp\.(gate_proj|up_proj|down_proj)\."), "dense_mlp"),
    (re.compile(r"\.(attn_hc|ffn_hc)\."), "hyper_connections"),
    (re.compile(r"\.(input_layernorm|post_attention_layernorm)\.|(^|model\.)norm\."), "norms"),
]


def parameter_group(name: str, layer_types: list[str]) -> str:
    """The group of parameter `name` (causal-LM or bare text-model naming)."""
    for pattern, group in _RULES:
        if pattern.search(name):
            return group
    if ".self_attn." in name and (m := _LAYER.search(name)):
        return "kda" if layer_types[int(m.group(1))] == "linear_attention" else "mla"
    return "other"


def count_parameters(model: Glm5NextCausalLM | Glm5NextTextModel) -> dict[str, int]:
    """Counts by group, `total` and `active` (routed experts at k / E; tied tensors once) of a causal or text model."""
    config = model.config
    assert config.layer_types is not None  # the config fills it
    counts = dict.fromkeys(GROUPS, 0)
    for name, param in model.named_parameters():  # tied parameters are yielded once
        counts[parameter_group(name, config.layer_types)] += param.numel()
    counts["total"] = sum(counts[g] for g in GROUPS)
    routed_active = counts["routed_experts"] * config.num_experts_per_tok // config.n_routed_experts
    counts["active"] = counts["total"] - counts["routed_experts"] + routed_active
    return counts


def format_counts(counts: dict[str, int]) -> str:
    """A small table: group, parameters, share of total."""
    total = counts["total"] or 1
    rows = [f"{g:<18} {counts[g]:>17,} {100 * counts[g] / total:6.2f}%" for g in GROUPS if counts[g]]
    rows.append(f"{'total':<18} {counts['total']:>17,}")
    rows.append(f"{'active per token':<18} {counts['active']:>17,}")
    return "\n".join(rows)
