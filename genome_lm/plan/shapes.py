"""What the planner needs to know about a model: its dimensions, its layers and their parameters,
read from the causal LM built on the meta device (exact counts and bytes as stored).

Letters: D model dim, S hc streams, V vocab, H/K heads and head dim (KDA), C KDA chunk, ql/R
q/kv LoRA ranks, DN/DV MLA head dims, HI/DI indexer heads/dim, E experts, k top-k, I widths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from genome_lm.model.params import count_parameters, parameter_group

if TYPE_CHECKING:
    from genome_lm.model.causal_lm import Glm5NextCausalLM


@dataclass(frozen=True)
class LayerShape:
    index: int
    attn: str  # "kda" | "dsa"
    mlp: str  # "dense" | "moe"
    indexer: str | None  # DSA: "full" (own indexer) | "shared" (reuses the previous selection)
    keeps_selection: bool  # DSA full layer whose selection a following shared layer reuses
    param_bytes: int  # all parameters of the layer, as stored
    expert_bytes: int  # routed-expert parameters (sharded over ep with expert parallelism)
    param_count: int
    expert_count: int  # routed-expert parameters (numel)

    @property
    def kind(self) -> str:
        return f"{self.attn}+{self.mlp}"


@dataclass(frozen=True)
class ModelShape:
    name: str
    dtype: str  # activation / parameter dtype of the model ("bfloat16" | "float32")
    D: int
    S: int
    V: int
    sinkhorn_iters: int
    # KDA
    kda_heads: int
    kda_head_dim: int
    kda_conv: int
    # DSA (MLA + k-pool indexer)
    dsa_heads: int
    q_lora: int
    kv_lora: int
    qk_nope: int
    v_head: int
    index_heads: int
    index_dim: int
    index_topk: int
    index_kpool: int
    index_tail: bool
    # MLPs
    dense_width: int
    moe_width: int
    shared_width: int
    experts: int
    top_k: int
    n_group: int
    topk_group: int
    layers: tuple[LayerShape, ...]
    counts: dict = field(default_factory=dict)  # count_parameters() groups
    param_bytes: int = 0  # whole model, as stored
    param_count: int = 0  # whole model (numel)
    root_param_bytes: int = 0  # embeddings + final norm + LM head (outside the decoder layers)
    lm_head_bytes: int = 0

    @property
    def act_bytes(self) -> int:
        """Bytes per element of activations (the model's dtype)."""
        return 2 if self.dtype == "bfloat16" else 4

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def selected_per_query(self, tokens: int) -> tuple[int, int]:
        """(S pools, W tokens) a DSA query attends to at sequence length `tokens`."""
        pools = min(self.index_topk // self.index_kpool, max(tokens // self.index_kpool, 1))
        tail = self.index_kpool - 1 if self.index_tail else 0
        return pools, pools * self.index_kpool + tail


def model_shape(name: str, dtype: str = "bfloat16", overrides: dict | None = None) -> ModelShape:
    """Build `name` (preset or checkpoint directory) on the meta device and describe it."""
    from genome_lm.model import build

    model = build(name, dtype=dtype, meta=True, **(overrides or {})).model
    return shape_of(model, name=str(name), dtype=dtype)


def shape_of(model: Glm5NextCausalLM, name: str = "model", dtype: str = "bfloat16") -> ModelShape:
    """Describe an already built causal LM (any device; meta is fine)."""
    c = model.config
    layer_types, indexer_types, mlp_types = c.layer_types, c.indexer_types, c.mlp_layer_types
    assert layer_types is not None and indexer_types is not None and mlp_types is not None  # the config fills them
    counts = count_parameters(model)
    layers = []
    for i, layer in enumerate(model.model.layers):
        params = list(layer.named_parameters())
        total = sum(p.numel() * p.element_size() for _, p in params)
        routed = [p for n, p in params if parameter_group(f"model.layers.{i}.{n}", layer_types) == "routed_experts"]
        experts = sum(p.numel() * p.element_size() for p in routed)
        attn = "kda" if layer_types[i] == "linear_attention" else "dsa"
        indexer = None if attn == "kda" else indexer_types[i]
        keeps = attn == "dsa" and indexer == "full" and bool(getattr(layer.self_attn, "next_skip_topk", False))
        layers.append(LayerShape(i, attn, "moe" if mlp_types[i] == "sparse" else "dense", indexer, keeps,
                                 total, experts, sum(p.numel() for _, p in params), sum(p.numel() for p in routed)))
    all_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    layer_bytes = sum(lay.param_bytes for lay in layers)
    return ModelShape(
        name=name, dtype=dtype, D=c.hidden_size, S=c.hc_mult, V=c.vocab_size, sinkhorn_iters=c.hc_sinkhorn_iters,
        kda_heads=c.linear_num_heads, kda_head_dim=c.linear_head_dim, kda_conv=c.linear_conv_kernel_dim,
        dsa_heads=c.num_attention_heads, q_lora=c.q_lora_rank, kv_lora=c.kv_lora_rank, qk_nope=c.qk_nope_head_dim,
        v_head=c.v_head_dim, index_heads=c.index_n_heads, index_dim=c.index_head_dim, index_topk=c.index_topk,
        index_kpool=c.index_kpool, index_tail=bool(c.index_kpool_always_select_tail),
        dense_width=c.intermediate_size, moe_width=c.moe_intermediate_size,
        shared_width=c.moe_intermediate_size * c.n_shared_experts, experts=c.n_routed_experts,
        top_k=c.num_experts_per_tok, n_group=c.n_group, topk_group=c.topk_group,
        layers=tuple(layers), counts=counts, param_bytes=all_bytes, root_param_bytes=all_bytes - layer_bytes,
        param_count=sum(p.numel() for p in model.parameters()),
        lm_head_bytes=model.lm_head.weight.numel() * model.lm_head.weight.element_size(),
    )
