"""The planner's saved-activation terms against what autograd really saves on glm53-tiny.

A forward with saved-tensor hooks records every storage autograd keeps (parameters excluded,
each storage once, attributed to the decoder layer whose forward first saved it). The planner's
`layer_input + layer_body` for that layer must match within 1% (the selection of DSA layers is
kept by the attention's context object, not through autograd, so it is left out here).
Outside the layers: input ids, final norm and hidden state, loss targets and log-sum-exp.
"""

from __future__ import annotations

import pytest
import torch

from genome_lm.model import apply_long_context, build
from genome_lm.model.patch import ALL_OPS
from genome_lm.plan import activations
from genome_lm.plan.layout import Layout
from genome_lm.plan.shapes import shape_of

T = 1024


def saved_by_layer(model, T: int) -> dict[int, int]:
    """Bytes of the storages first saved during each decoder layer's forward (-1: outside)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    current = [-1]
    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_pre_hook(lambda mod, args, i=i: current.__setitem__(0, i)))
        hooks.append(layer.register_forward_hook(lambda mod, args, out: current.__setitem__(0, -1)))
    seen: dict[int, int] = {}
    owner: dict[int, int] = {}
    keep = []  # every saved tensor stays referenced, so no recorded address is reused by another storage

    def pack(t):
        keep.append(t)
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in params and ptr not in seen and st.nbytes():
            seen[ptr], owner[ptr] = st.nbytes(), current[0]
        return t

    ids = torch.randint(0, 5, (1, T))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids)
    for h in hooks:
        h.remove()
    out: dict[int, int] = {}
    for ptr, nbytes in seen.items():
        out[owner[ptr]] = out.get(owner[ptr], 0) + nbytes
    return out


@pytest.mark.parametrize("dtype, moe_recompute, hc_recompute", [
    ("float32", False, True), ("float32", True, False), ("bfloat16", False, False), ("bfloat16", True, True)])
def test_saved_bytes_per_layer_match_autograd(dtype, moe_recompute, hc_recompute):
    torch.manual_seed(0)
    model = build("glm53-tiny", dtype=dtype).model
    # without "hc": upstream's hyper-connections, keeping their Sinkhorn intermediates
    apply_long_context(model, moe_recompute=moe_recompute, moe_block_tokens=1024, dsa_block_queries=512,
                       ops=ALL_OPS if hc_recompute else tuple(op for op in ALL_OPS if op != "hc"))
    measured = saved_by_layer(model, T)
    m = shape_of(model, "glm53-tiny", dtype)
    layout = Layout(seq_len=T, moe_recompute=moe_recompute, moe_block_tokens=1024, dsa_block_queries=512,
                    hc_recompute=hc_recompute)
    for layer in m.layers:
        body = activations.layer_body(m, layer, layout, backend="torch", imbalance=1.0)
        body.pop("dsa_selection", None)
        predicted = activations.layer_input(m, T) + sum(body.values())
        got = measured[layer.index]
        assert abs(predicted - got) <= 0.01 * got, (layer.kind, predicted / T, got / T, body)
    outside = sum(activations.outside_layers(m, T).values())
    assert abs(outside - measured[-1]) <= 0.01 * measured[-1]
