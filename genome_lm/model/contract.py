"""What genome_lm relies on in upstream `transformers` (and private torch), checked so that a mismatch is
one line naming the symbol, the installed version, the supported range and the fix: `check_symbols()`
on importing `model/upstream.py`, `check_model(model)` on a built model, `check_torch()` when a
rehearsal starts. `SUPPORTED` is pyproject.toml's transformers range, `TESTED` the locked version."""

from __future__ import annotations

import importlib
import inspect
from functools import cache

from torch import nn

from genome_lm.errors import GenomeLMError

SUPPORTED = ">=5.25.0,<5.26"
TESTED = "5.25.0"
FIX = f"`make setup` (installs requirements.lock) or `pip install 'transformers{SUPPORTED}'`"

MODULE = "transformers.models.glm5_next.modeling_glm5_next"
CONFIG_MODULE = "transformers.models.glm5_next.configuration_glm5_next"

# Upstream module globals that may be bound to an optional package's or a hub kernel (model/upstream.py).
KERNEL_FALLBACK_FUNCTIONS = (
    "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention",
    "causal_conv1d_forward", "causal_conv1d_fn", "causal_conv1d_update",
)
# Classes and functions of MODULE: subclassed, swapped, called or routed (model/upstream.py).
SYMBOLS = (
    "Glm5NextConfig", "Glm5NextTextConfig", "Glm5NextPreTrainedModel", "Glm5NextTextModel",
    "Glm5NextTextDecoderLayer", "Glm5NextTextAttention", "Glm5NextTextIndexer", "Glm5NextTextLinearAttention",
    "Glm5NextTextForgetGate", "Glm5NextTextRMSNorm", "Glm5NextTextRMSNormGated", "Glm5NextTextUnweightedRMSNorm",
    "Glm5NextTextHyperConnection", "Glm5NextTextMLP", "Glm5NextTextMoE", "Glm5NextTextExperts",
    "Glm5NextTextTopkRouter", "Glm5NextForConditionalGeneration", *KERNEL_FALLBACK_FUNCTIONS,
)

# Parameters, in order, of what genome_lm replaces (a subclass's forward takes upstream's call)
# or calls by keyword. "Class.method" or a function of MODULE.
SIGNATURES = {
    "Glm5NextTextLinearAttention.forward": ("self", "hidden_states", "cache", "attention_mask", "kwargs"),
    "Glm5NextTextAttention.forward": ("self", "hidden_states", "attention_mask", "cache", "prev_topk_indices",
                                      "kwargs"),
    "Glm5NextTextIndexer.forward": ("self", "hidden_states", "q_resid", "attention_mask", "cache"),
    "Glm5NextTextMoE.forward": ("self", "hidden_states"),
    "Glm5NextTextExperts.forward": ("self", "hidden_states", "top_k_index", "top_k_weights"),
    "Glm5NextTextHyperConnection.forward": ("self", "hidden_streams"),
    "Glm5NextTextMLP.forward": ("self", "x"),
    "Glm5NextTextRMSNorm.forward": ("self", "hidden_states"),
    "Glm5NextTextRMSNormGated.forward": ("self", "hidden_states", "gate"),
    "Glm5NextTextForgetGate.forward": ("self", "hidden_states"),
    "Glm5NextTextModel.forward": ("self", "input_ids", "attention_mask", "position_ids", "cache", "inputs_embeds",
                                  "use_cache", "kwargs"),
}

# `transformers.DynamicCache` methods the KDA layer's cache path and streaming eval call.
CACHE_METHODS = {
    "DynamicCache.get_conv_state": ("self", "layer_idx", "state_idx"),
    "DynamicCache.update_conv_state": ("self", "conv_states", "layer_idx", "state_idx", "kwargs"),
    "DynamicCache.get_recurrent_state": ("self", "layer_idx", "state_idx"),
    "DynamicCache.update_recurrent_state": ("self", "recurrent_states", "layer_idx", "state_idx", "kwargs"),
    "DynamicCache.get_recurrent_states_to_keep": ("self", "layer_idx"),
    "DynamicCache.get_seq_length": ("self", "layer_idx"),
}

# Class attributes read at import or build time.
CLASS_ATTRIBUTES = {
    "Glm5NextPreTrainedModel": ("_keep_in_fp32_modules_strict",),
}

# `Glm5NextTextConfig` fields the presets, planner, checkpoint reader and layers read.
CONFIG_FIELDS = (
    "vocab_size", "pad_token_id", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads",
    "index_head_dim", "index_topk", "index_kpool", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
    "n_group", "topk_group", "mlp_layer_types", "layer_types", "indexer_types", "hc_mult", "hidden_act",
    "rms_norm_eps", "attention_dropout", "initializer_range", "tie_word_embeddings", "dtype",
)

# Attributes upstream's `__init__` sets on each module and genome_lm reads (checked on instances).
ATTRIBUTES = {
    "Glm5NextTextLinearAttention": (
        "layer_idx", "num_heads", "head_dim", "qkv_dim", "conv_kernel_size", "activation", "q_proj", "k_proj",
        "v_proj", "conv1d", "forget_gate", "b_proj", "g_a_proj", "g_b_proj", "o_norm", "o_proj",
    ),
    "Glm5NextTextForgetGate": ("f_a_proj", "f_b_proj", "A_log", "dt_bias"),
    "Glm5NextTextRMSNormGated": ("weight", "variance_epsilon"),
    "Glm5NextTextRMSNorm": ("weight", "variance_epsilon"),
    "Glm5NextTextUnweightedRMSNorm": ("variance_epsilon",),
    "Glm5NextTextHyperConnection": ("hc_mult", "hc_sinkhorn_iters", "hc_eps", "fn", "base", "scale",
                                    "input_norm"),
    "Glm5NextTextMLP": ("gate_proj", "up_proj", "down_proj"),
    "Glm5NextTextAttention": (
        "config", "layer_idx", "num_heads", "qk_head_dim", "kv_lora_rank", "scaling", "q_a_proj", "q_a_layernorm",
        "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj", "indexer",
    ),
    "Glm5NextTextIndexer": ("n_heads", "head_dim", "wq_b", "wk", "k_norm", "weights_proj",
                            "index_kpool_compress_gate"),
    "Glm5NextTextMoE": ("config", "experts", "gate", "shared_experts"),
    "Glm5NextTextExperts": ("config", "gate_up_proj", "down_proj"),
    "Glm5NextTextDecoderLayer": ("mlp",),
    "Glm5NextTextModel": ("config", "embed_tokens", "layers"),
}

# Private torch the rehearsal imports, subclasses, replaces or calls: "Class.method" of TORCH_CLASSES.
TORCH_CLASSES = {
    "FSDPMemTracker": "torch.distributed._tools.fsdp2_mem_tracker",
    "MemTracker": "torch.distributed._tools.mem_tracker",  # FSDPMemTracker's base: sets the state in `__init__`
    "ModTracker": "torch.distributed._tools.mod_tracker",
    "FakeStore": "torch.testing._internal.distributed.fake_pg",
}
TORCH_SIGNATURES = {
    "FSDPMemTracker._update_peak_stats": ("self", "peak_state"),  # replaced
    "ModTracker.register_user_hooks": ("self", "pre_fw_hook", "post_fw_hook", "pre_bw_hook", "post_bw_hook"),
    "ModTracker.get_known_fqn": ("self", "mod"),
}
# State that `__init__` sets and the rehearsal's tracker reads (checked on instances).
TORCH_ATTRIBUTES = {
    "MemTracker": ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_mod_tracker"),
    "ModTracker": ("parents", "is_bw"),
}
TORCH_TESTED = "2.13.0"


class UpstreamMismatch(GenomeLMError):
    """The installed transformers lacks, or changed, something genome_lm relies on."""


def installed_version() -> str:
    try:
        return importlib.import_module("transformers").__version__
    except ImportError:
        return "not installed"


def _mismatch(problems: list[str], what: str | None = None, fix: str | None = None) -> UpstreamMismatch:
    """One line: what does not match (the installed transformers), the first problem and how many more."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    what = what or f"transformers {installed_version()} does not match genome_lm"
    fix = fix or f"genome_lm needs transformers{SUPPORTED} (tested on {TESTED}). Fix: {FIX}"
    return UpstreamMismatch(f"{what}: {problems[0]}{more}; {fix}")


def _signature_problems(classes: dict, signatures: dict[str, tuple[str, ...]], missing: str) -> list[str | None]:
    """Each "Class.method" of `signatures` whose class is in `classes`: `missing` (formatted with `cls`,
    `method`) when it is absent, a line when its parameters differ, else None."""
    problems: list[str | None] = []
    for where, expected in signatures.items():
        cls_name, method_name = where.split(".")
        method = getattr(classes.get(cls_name), method_name, None)
        if method is None:  # a missing class is reported with the classes
            problems.append(missing.format(cls=cls_name, method=method_name) if cls_name in classes else None)
            continue
        try:
            got = tuple(inspect.signature(inspect.unwrap(method)).parameters)  # past upstream's kernel decorators
        except (TypeError, ValueError):
            continue
        if got != expected:
            problems.append(f"{where} takes ({', '.join(got)}), genome_lm calls it as ({', '.join(expected)})")
    return problems


def symbol_problems() -> list[str]:
    try:
        glm = importlib.import_module(MODULE)
        config_module = importlib.import_module(CONFIG_MODULE)
        from transformers import DynamicCache
    except ImportError as e:
        return [f"{MODULE} cannot be imported ({e})"]
    problems: list[str | None] = [f"{MODULE} has no {name}" for name in SYMBOLS if not hasattr(glm, name)]
    problems += _signature_problems(vars(glm), SIGNATURES, f"{MODULE} has no {{cls}}.{{method}}")
    problems += _signature_problems({"DynamicCache": DynamicCache}, CACHE_METHODS,
                                    "DynamicCache has no method {method}")
    for cls_name, attrs in CLASS_ATTRIBUTES.items():
        cls = getattr(glm, cls_name, None)
        problems += [f"{cls_name} has no attribute {a!r}" for a in attrs if cls is not None and not hasattr(cls, a)]
    config_cls = getattr(config_module, "Glm5NextTextConfig", None)
    if config_cls is not None:
        config = config_cls()
        problems += [f"Glm5NextTextConfig has no field {f!r}" for f in CONFIG_FIELDS if not hasattr(config, f)]
    return [p for p in problems if p]


@cache
def check_symbols() -> None:
    """Raise `UpstreamMismatch` (one line, the first problem and how many more) unless all symbols match."""
    if problems := symbol_problems():
        raise _mismatch(problems)


def attribute_problems(model: nn.Module) -> list[str]:
    """Every ATTRIBUTES entry missing on the first module of its class in `model`."""
    glm = importlib.import_module(MODULE)
    first: dict[str, nn.Module] = {}
    for module in model.modules():
        for cls_name in ATTRIBUTES:
            if isinstance(module, getattr(glm, cls_name)):
                first.setdefault(cls_name, module)
    return [f"{cls_name} has no attribute {a!r}" for cls_name, module in first.items() for a in ATTRIBUTES[cls_name]
            if not hasattr(module, a)]


def check_model(model: nn.Module) -> None:
    if problems := attribute_problems(model):
        raise _mismatch(problems)


def torch_problems() -> list[str]:
    classes: dict[str, type] = {}
    problems: list[str | None] = []
    for name, module in TORCH_CLASSES.items():
        try:
            classes[name] = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            problems.append(f"{module}.{name} cannot be imported ({e})")
    problems += _signature_problems(classes, TORCH_SIGNATURES, "torch's {cls} has no {method}")
    if "MemTracker" in classes:
        tracker = classes["MemTracker"]()
        for cls_name, instance in (("MemTracker", tracker), ("ModTracker", getattr(tracker, "_mod_tracker", None))):
            problems += [f"torch's {cls_name} has no attribute {a!r}" for a in TORCH_ATTRIBUTES[cls_name]
                         if not hasattr(instance, a)]
    return [p for p in problems if p]


@cache
def check_torch() -> None:
    """Raise `UpstreamMismatch` (one line) unless the private torch the rehearsal relies on matches."""
    import torch

    if problems := torch_problems():
        raise _mismatch(problems, f"torch {torch.__version__} does not match genome_lm's rehearsal",
                        f"tested on torch {TORCH_TESTED}. Fix: `make setup` (installs requirements.lock)")


def summary() -> str:
    """One line: the installed transformers matches genome_lm, with how much the contract holds."""
    return (f"transformers {installed_version()} matches genome_lm ({len(SYMBOLS)} symbols, "
            f"{len(SIGNATURES) + len(CACHE_METHODS)} signatures, {sum(map(len, ATTRIBUTES.values()))} attributes, "
            f"{len(CONFIG_FIELDS)} config fields); torch's rehearsal contract holds ({len(TORCH_SIGNATURES)} "
            f"signatures, {sum(map(len, TORCH_ATTRIBUTES.values()))} attributes)")
