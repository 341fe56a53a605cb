"""The GLM-5.3-Flash causal LM on upstream `transformers` (`glm5_next`), and its long-context patches.

    built = build("glm53-tiny")                      # or a checkpoint dir; meta=True to count
    model = built.model                              # also built.source, .dtype, .load_report
    apply_long_context(model, moe_block_tokens=4096)  # in place
    out = model(input_ids, labels=input_ids, return_per_token_nll=True)
    save_pretrained(model, "runs/x/checkpoints/last", tokenizer_from=built.source)
"""

from genome_lm.model.build import BuiltModel, build
from genome_lm.model.causal_lm import CausalLMOutput, Glm5NextCausalLM
from genome_lm.model.ops.moe import expert_load
from genome_lm.model.params import count_parameters, format_counts
from genome_lm.model.patch import apply_long_context
from genome_lm.model.presets import PRESETS, preset_config, token_lut, token_map
from genome_lm.model.upstream import route_cpu_to_torch, use_torch_fallbacks
from genome_lm.model.weights.writer import save_pretrained

__all__ = ["build", "BuiltModel", "Glm5NextCausalLM", "CausalLMOutput", "save_pretrained", "apply_long_context",
           "count_parameters", "format_counts", "expert_load", "PRESETS", "preset_config", "token_lut", "token_map",
           "route_cpu_to_torch", "use_torch_fallbacks"]
