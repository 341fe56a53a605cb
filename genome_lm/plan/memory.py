"""Memory per GPU over one training step (`plan_memory`), and of a forward pass without gradients (what
`genome-lm eval` and `score` need per rank): the peak, where it happens, and what it is made of.

The training step is walked phase by phase as the trainer runs it (docs/plan.md, The memory model). On a
CPU (one process, no FSDP) parameters and optimizer states are part of the measured process baseline; the
step adds gradients, activations and transients. `plan_forward` walks a forward the same way, keeping
nothing for backward; its layouts use `moe_recompute=True` (without autograd the MoE keeps no block's
activations beyond the block running). `plan_score` (`genome-lm plan --score`) streams a region in chunks
(`model/streaming.py`): one chunk's forward, whose DSA layers attend to every token so far (its op counts
the layer's cache once more: `torch.cat`'s copy), plus what is carried between chunks (`carried_bytes`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

from genome_lm.config import MemoryConfig
from genome_lm.plan import activations as act
from genome_lm.plan.activations import F32, Op, loss_transients, ops_by_layer
from genome_lm.plan.hardware import Assumptions
from genome_lm.plan.layout import Layout
from genome_lm.plan.shapes import LayerShape, ModelShape

MASTER_BYTES = 4  # float32 master weights and gradients, per parameter


@dataclass
class ForwardPlan:
    peak_bytes: int
    peak_where: str
    breakdown: dict[str, int]  # components of the peak, summing to peak_bytes
    weights_bytes: int  # this rank's shard of the parameters


@dataclass
class MemoryPlan:
    peak_bytes: int
    peak_where: str
    breakdown: dict[str, int]  # components of the peak, summing to peak_bytes
    host_bytes_per_gpu: int
    activations_by_layer_type: dict[str, int]  # bytes per layer of that type without recompute
    kept_by_layer_type: dict[str, int]  # what one layer of that type keeps between forward and backward
    phases: list[tuple[str, int]] = field(default_factory=list)
    phase_parts: dict[str, dict[str, int]] = field(default_factory=dict)  # every phase's components


def pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def shard_degree(layout: Layout, assume: Assumptions) -> int:
    return layout.dp * (layout.parallel.cp if assume.shard_over_cp else 1)


def layer_shard_count(layer: LayerShape, m: ModelShape, layout: Layout, F: int) -> int:
    """Parameters of `layer` one rank holds once FSDP2 has sharded it over F ranks. FSDP2 splits dim 0
    and pads it to a multiple of the ranks: the routed experts [E, ...] are whole experts per rank,
    ceil((E / ep) / (F / ep)) of them (36 experts over 8 ranks: 5, not 4.5); the rest is counted as
    numel / F (their dim 0 is large, their padding negligible)."""
    if not layer.expert_count or F <= 1:
        return -(-layer.param_count // F)
    return -(-(layer.param_count - layer.expert_count) // F) + experts_per_rank(m, layout, F) * (
        layer.expert_count // m.experts)


def experts_per_rank(m: ModelShape, layout: Layout, F: int) -> int:
    """Routed experts of a layer one rank holds: its ep share, split whole by FSDP2 over F / ep ranks."""
    ep = layout.parallel.ep if F % layout.parallel.ep == 0 else 1
    return -(-(m.experts // ep) // max(1, F // ep))


def optimizer_temp(m: ModelShape, layout: Layout, F: int, params: int, assume: Assumptions) -> int:
    """Temporaries of the optimizer step. torch's AdamW (float32 moments; foreach on GPUs):
    `adamw_temp_copies` x the shard. genome_lm's AdamW with bf16 moments (train/optim.py) updates
    one tensor at a time: float32 copies of both moments, sqrt(v) and the denominator, 4 x the
    largest tensor's shard in float32 (a layer's stacked gate_up experts, or the embeddings)."""
    if layout.state_bytes != 2:
        return int(assume.adamw_temp_copies * params)
    experts = experts_per_rank(m, layout, F) * 2 * m.moe_width * m.D if m.experts else 0
    largest = max(experts, -(-m.V // F) * m.D, -(-2 * m.dense_width // F) * m.D)
    return 4 * MASTER_BYTES * largest


def unsharded_layer_bytes(layer: LayerShape, layout: Layout) -> int:
    """A layer's parameters as FSDP2 all-gathers them (routed experts: this rank's ep share)."""
    return layer.param_bytes - layer.expert_bytes + layer.expert_bytes // layout.parallel.ep


def kept(ops: list[Op], m: ModelShape, layer: LayerShape, layout: Layout,
         assume: Assumptions) -> tuple[int, int, int]:
    """(device bytes, host bytes, pinned host bytes) layer keeps between its forward and backward."""
    n = layout.tokens
    small = n * (1 + 8 + 8)  # attention mask, position ids, input ids (shared storages on device)
    if layout.wraps("layer"):  # one wrapped unit: the layer, its input the streams
        k, one = 1, act.layer_input(m, n)
        device = sum(op.saved.get("dsa_selection", 0) for op in ops) if layer.keeps_selection else 0
    else:  # k wrapped parts, each with an input [n, D]
        wrapped = {op.part for op in ops if op.part and layout.wraps(op.part)}
        k, one = len(wrapped), n * m.act_bytes * m.D
        device = sum(op.saved_bytes for op in ops if op.part not in wrapped)
    if layout.memory.offload_layer_inputs and k:
        return (device + (k * one if assume.offload_keeps_device_input else 0), k * (one + small),
                k * (pow2(one) + pow2(n) + 2 * pow2(8 * n)))
    return device + k * one, 0, 0


def _walk(ops: list[Op], backward: bool = False, comm: Callable[[Op], int] = lambda op: 0) -> tuple[int, int, int, str]:
    """(saved bytes alive, transient bytes, FSDP2 buffers, op) at the peak of a layer's forward with autograd
    on, or of its backward (the ops in reverse; `comm(op)`: the FSDP2 buffers live during `op`'s backward)."""
    best = (0, 0, 0, "")
    steps = list(zip(ops, accumulate(op.saved_bytes for op in ops)))
    for op, saved in reversed(steps) if backward else steps:
        transient, buffers = (op.bwd, comm(op)) if backward else (op.fwd, 0)
        if saved + transient + buffers > sum(best[:3]):
            best = (saved, transient, buffers, op.name)
    return best


def _layer_buffers(m: ModelShape, layout: Layout, F: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per layer: its unsharded gradients, gathered routed experts (padded), gathered parameters, and the
    parameters of its FSDP2 group (under ep the experts are a group apart, parallel/__init__.py). The gathered
    experts: dim 0 padded to whole experts on each of the F / ep ranks (`experts_per_rank`), in the
    all-gather's buffer and in the gathered parameters, which are views of padded outputs."""
    ep, fsdp_ep = layout.parallel.ep, layout.parallel.ep if F % layout.parallel.ep == 0 else 1
    Gs = [unsharded_layer_bytes(lay, layout) for lay in m.layers]
    Xs = [experts_per_rank(m, layout, F) * max(1, F // fsdp_ep) * (lay.expert_bytes // m.experts)
          if lay.expert_count else 0 for lay in m.layers]
    Us = [G - lay.expert_bytes // ep + X for G, lay, X in zip(Gs, m.layers, Xs)]
    return Gs, Xs, Us, [U - (X if ep > 1 else 0) for U, X in zip(Us, Xs)]


def _backward_buffers(ops: list[Op], layer: LayerShape, layout: Layout, sizes: tuple[int, int, int, int, int],
                      red: float, grouped: bool) -> Callable[[Op], int]:
    """FSDP2's buffers during each op's backward in `layer`, from `sizes`: (gathered parameters with those
    prefetched, unsharded gradients, gathered routed experts, the reduce-scatter input pending from the
    layer after, the LM head's gradient). The experts' gradients exist from the MoE's backward on (`ops`
    counts the first block's without gate_up's); under ep the experts are a group of their own
    (parallel/__init__.py), resharded and reduce-scattered before the layer's ops ahead of the MoE run their
    backward. FSDP2 keeps the last reduce-scatter's input until the next group reduce-scatters: the
    pending one lives through the MLP's backward, until the first float32 group (router,
    hyper-connection; `grouped`) reduce-scatters, or through the layer without them. Under ep an
    all-gather of the experts (their padded size) stays alive where the rehearsal measures it: in the
    MoE's backward unless memory.moe_recompute rebuilds its blocks or the default backward prefetch (1)
    meets several blocks, and with the default prefetch in the backward of the ops ahead of the MoE."""
    gathered, grads, X, pending, head_grad = sizes
    ep, default_prefetch = layout.parallel.ep, layout.parallel.backward_prefetch == 1
    parts = [o.part for o in ops]
    mlp = parts.index("moe") if "moe" in parts else parts.index("dense")
    at = {o.name: k - mlp for k, o in enumerate(ops)}  # > 0: after the MLP in forward order
    experts = layer.expert_bytes // ep  # their unsharded gradients
    # a rebuilt MoE in one block peaks before its down projection's weight gradient (a third) exists
    rebuilt_once = ep > 1 and layout.memory.moe_recompute and layout.memory.moe_block_tokens >= layout.tokens
    blocks = layout.memory.moe_block_tokens < layout.tokens
    in_moe = 0 if layout.memory.moe_recompute or (default_prefetch and blocks) else X
    all_gather = (X if default_prefetch else 0, in_moe) if ep > 1 else (0, 0)

    def buffers(op: Op) -> int:
        order = at[op.name]
        done = ep > 1 and order < 0  # the experts resharded, their gradients reduce-scattered
        rs = pending if order >= 0 or ep > 1 or not grouped else 0
        rs = int(X * red) if done and X and not grouped else rs
        late = experts if order > 0 or done else experts // 3 if order == 0 and rebuilt_once else 0
        return (gathered - (X if done else 0) + grads - late + rs
                + all_gather[order >= 0] + head_grad)
    return buffers


def _nograd_forward(ops: list[Op], m: ModelShape, n: int) -> tuple[int, int, str]:
    """Forward of a wrapped layer (no autograd): its streams plus one op's tensors at a time."""
    op = max(ops, key=lambda o: o.saved_bytes + o.fwd)
    return 2 * act.layer_input(m, n), op.saved_bytes + op.fwd, op.name


def plan_memory(m: ModelShape, layout: Layout, assume: Assumptions, gpu: bool, backend: str) -> MemoryPlan:
    n, a = layout.tokens, m.act_bytes
    streams = act.layer_input(m, n)  # a layer's input (and output), [n, S, D]
    F = shard_degree(layout, assume) if gpu else 1
    fsdp = gpu and layout.gpus > 1
    # training holds float32 master weights, float32 gradients and two AdamW moments per parameter,
    # sharded (genome_lm.parallel, train/optim.py); the gathered copies are in the model's dtype
    shard_counts = [layer_shard_count(lay, m, layout, F) for lay in m.layers]
    root_count = -(-(m.param_count - sum(lay.param_count for lay in m.layers)) // F)
    held = sum(shard_counts) + root_count  # parameters per rank, FSDP2's padding included
    params = MASTER_BYTES * held
    persistent = {"parameters": params if gpu else 0, "optimizer_states": 2 * layout.state_bytes * held if gpu else 0}
    if fsdp:  # embeddings, final norm, LM head: gathered from the forward to the end of the backward
        persistent["fsdp_root_unsharded"] = m.root_param_bytes
    layer_grads = [MASTER_BYTES * c for c in shard_counts]
    root_grads = MASTER_BYTES * root_count
    ep = layout.parallel.ep
    Gs, Xs, Us, prefetched = _layer_buffers(m, layout, F)

    def gathered(i: int, ahead: int, step: int) -> int:
        """Layer i's gathered parameters and the `ahead` prefetched after it in step's order (backward: no experts)."""
        later = range(i + step, i + step * (ahead + 1), step)
        return Us[i] + sum((Us if step > 0 else prefetched)[j] for j in later if 0 <= j < len(Us)) if fsdp else 0
    red = layout.reduce_bytes / a

    all_ops, keeps = _layers(m, layout, assume, gpu, backend)
    outside = act.outside_layers(m, n)
    ids = outside["input_ids"] + n * 8  # input ids and labels on the device
    phases: list[tuple[str, dict[str, int]]] = []

    def phase(name: str, **parts: int) -> None:
        phases.append((name, {**persistent, **{k: v for k, v in parts.items() if v}}))

    kept_before = 0
    for i, (ops, lay) in enumerate(zip(all_ops, m.layers)):
        # under ep the experts' all-gather buffer lives until the next group's all-gather
        comm = gathered(i, assume.fsdp_prefetch_layers, 1) + (Xs[i] if fsdp and ep > 1 else 0)
        saved, transient, *_, op = _nograd_forward(ops, m, n) if layout.wraps("layer") else _walk(ops)
        phase(f"forward of layer {i} ({lay.kind}): {op}", kept_activations=kept_before, current_layer=saved,
              op_transient=transient, fsdp_buffers=comm, inputs=ids)
        kept_before += keeps[i][0]
    final = outside["final_norm"] + outside["final_hidden"] + outside["loss_targets"]
    lf, lb = loss_transients(m, layout)
    root = m.lm_head_bytes + int(m.lm_head_bytes * red) if fsdp else 0
    phase("loss forward (chunked LM head)", kept_activations=kept_before, inputs=ids, final=final, loss_chunk=lf)
    phase("loss backward (chunked LM head)", kept_activations=kept_before, inputs=ids, final=final, loss_chunk=lb,
          gradients=root_grads, fsdp_buffers=root)
    grads = root_grads
    # the LM head's unsharded gradient (loss backward) waits for the root's reduce-scatter at the backward's end
    head_grad = m.lm_head_bytes if fsdp else 0
    for i in reversed(range(m.n_layers)):
        ops, lay = all_ops[i], m.layers[i]
        kept_before -= keeps[i][0]
        U_bwd = gathered(i, layout.parallel.backward_prefetch, -1)
        # its reduce-scatter: the unsharded gradients and their copy in the reduce dtype (ep: the experts' before)
        own_rs = Gs[i] - (lay.expert_bytes // ep if ep > 1 else 0) + int(prefetched[i] * red)
        pending = int(prefetched[i + 1] * red) if fsdp and i + 1 < m.n_layers else 0
        buffers_during = _backward_buffers(ops, lay, layout, (U_bwd, Gs[i], Xs[i], pending, head_grad), red,
                                           a < MASTER_BYTES) if fsdp else (lambda op: 0)
        # the next backward's offloaded input is copied back during this one (train/parallelize.py)
        ahead = streams if gpu and i > 0 and keeps[i - 1][1] else 0
        saved, transient, buffers, op = _walk(ops, True, buffers_during)
        phase(f"backward of layer {i} ({lay.kind}): {op}", kept_activations=kept_before + ahead, current_layer=saved,
              op_transient=transient, grad_streams=2 * streams, fsdp_buffers=buffers, gradients=grads, inputs=ids)
        grads += layer_grads[i]
        if fsdp:
            phase(f"reduce-scatter of layer {i} ({lay.kind})", kept_activations=kept_before + ahead,
                  grad_streams=streams, fsdp_buffers=own_rs + head_grad, gradients=grads, inputs=ids)
        if layout.wraps("layer") or any(layout.wraps(o.part) for o in ops if o.part):
            saved, transient, _, op = _walk(ops)
            phase(f"recompute of layer {i} ({lay.kind}): {op}", kept_activations=kept_before + ahead,
                  current_layer=saved, op_transient=transient, grad_streams=streams,
                  fsdp_buffers=U_bwd + pending + head_grad if fsdp else 0, gradients=grads - layer_grads[i], inputs=ids)
    persistent.pop("fsdp_root_unsharded", None)  # FSDP2 reshards the root at the end of the backward
    phase("optimizer step (AdamW)", gradients=grads, optimizer_temp=optimizer_temp(m, layout, F, params, assume))
    return _memory_plan(phases, m, all_ops, keeps, assume)


def _layers(m: ModelShape, layout: Layout, assume: Assumptions, gpu: bool,
            backend: str) -> tuple[list[list[Op]], list[tuple[int, int, int]]]:
    """Each layer's ops, and what it keeps for backward: (device, host, pinned host) bytes."""
    all_ops = ops_by_layer(m, layout, backend, assume.expert_imbalance)
    on_device = layout.replace(offload_layer_inputs=False)  # the last offload_keep_last layers are not offloaded
    keeps = [kept(ops, m, lay, layout if i < m.n_layers - layout.memory.offload_keep_last else on_device, assume)
             for i, (ops, lay) in enumerate(zip(all_ops, m.layers))]
    if not gpu:  # on a CPU the "host" copy of an offloaded input is in the same memory
        keeps = [(dev + host, 0, 0) for dev, host, _ in keeps]
    return all_ops, keeps


def _memory_plan(phases: list[tuple[str, dict[str, int]]], m: ModelShape, all_ops: list[list[Op]],
                 keeps: list[tuple[int, int, int]], assume: Assumptions) -> MemoryPlan:
    """The plan of the walked `phases`: the peak, where it is, and the per-layer-type terms."""
    name, parts = max(phases, key=lambda p: sum(p[1].values()))
    by_type_full: dict[str, int] = {}
    by_type_kept: dict[str, int] = {}
    for ops, lay, kp in zip(all_ops, m.layers, keeps):
        by_type_full.setdefault(lay.kind, sum(op.saved_bytes for op in ops))
        by_type_kept.setdefault(lay.kind, kp[0])
    return MemoryPlan(
        peak_bytes=sum(parts.values()), peak_where=name, breakdown=parts,
        host_bytes_per_gpu=sum(k[2] if assume.pinned_pow2 else k[1] for k in keeps),
        activations_by_layer_type=by_type_full, kept_by_layer_type=by_type_kept,
        phases=sorted(((p, sum(c.values())) for p, c in phases), key=lambda x: -x[1]),
        phase_parts=dict(phases),
    )


def plan_forward(m: ModelShape, layout: Layout, assume: Assumptions | None = None, backend: str = "fla",
                 keys: int | None = None) -> ForwardPlan:
    """Peak bytes per rank of a no-grad forward of one piece of `layout.seq_len` tokens, split over
    `layout.parallel.cp` ranks, with FSDP2 over all `layout.gpus` ranks when > 1.
    `keys`: the tokens DSA attends to when more than the piece (a streaming chunk: the prefix too)."""
    assume = assume or Assumptions()
    layout.check()
    fsdp = layout.gpus > 1
    n = layout.tokens
    weights = m.param_bytes // shard_degree(layout, assume) if fsdp else m.param_bytes
    persistent = {"weights": weights, "root_gathered": m.root_param_bytes if fsdp else 0}
    prefetch = 1 + assume.fsdp_prefetch_layers
    ids = 2 * n * 8  # input ids and labels, int64
    phases: list[tuple[str, dict[str, int]]] = []
    for i, (lay, ops) in enumerate(zip(m.layers, ops_by_layer(m, layout, backend, assume.expert_imbalance, keys))):
        streams, op_bytes, op = _nograd_forward(ops, m, n)
        gathered = min(prefetch, m.n_layers - i) * unsharded_layer_bytes(lay, layout) if fsdp else 0
        phases.append((f"forward of layer {i} ({lay.kind}): {op}",
                       {**persistent, "layer_gathered": gathered, "streams": streams, "op": op_bytes,
                        "input_ids": ids}))
    outside = act.outside_layers(m, n)
    per_token = layout.train.micro_batch * layout.seq_len * (2 * F32 + 1)  # gathered NLL, shifted copy, mask
    phases.append(("LM head + per-token NLL", {**persistent, "final": outside["final_norm"] + outside["final_hidden"],
                                               "loss_chunk": loss_transients(m, layout)[0], "per_token_nll": per_token,
                                               "input_ids": ids}))
    where, parts = max(phases, key=lambda p: sum(p[1].values()))
    parts = {k: v for k, v in parts.items() if v}
    return ForwardPlan(sum(parts.values()), where, parts, weights)


def carried_bytes(m: ModelShape, tokens: int) -> dict[str, int]:
    """{"kda_state", "dsa_caches"}: bytes the streaming scorer carries after `tokens` tokens (batch 1)."""
    a, HK = m.act_bytes, m.kda_heads * m.kda_head_dim
    kda = HK * m.kda_head_dim * F32 + 3 * HK * m.kda_conv * a + 8
    return {"kda_state": sum(kda for lay in m.layers if lay.attn == "kda"),
            "dsa_caches": sum(tokens * a * (m.kv_lora + (2 * m.index_dim + 1 if lay.indexer == "full" else 0))
                              for lay in m.layers if lay.attn == "dsa")}


def plan_score(m: ModelShape, tokens: int, chunk: int, gpus: int = 1, cp: int = 1,
               assume: Assumptions | None = None, backend: str = "fla",
               memory: MemoryConfig | None = None) -> ForwardPlan:
    """Peak bytes per device of scoring a `tokens`-long region: streamed in chunks of `chunk` tokens
    (cp = 1; FSDP2 over `gpus` ranks when > 1), or as one piece over `cp` context-parallel ranks.
    `memory`: block sizes (default: the trainer's). Its breakdown: weights, kda_state, dsa_caches, activations."""
    base = Layout(tokens, memory.model_copy()) if memory else Layout(tokens)
    if cp > 1:
        plan = plan_forward(m, base.replace(cp=cp, dp=gpus // cp, moe_recompute=True), assume, backend)
        carried = {"kda_state": 0, "dsa_caches": 0}
    else:
        layout = base.replace(seq_len=min(chunk, tokens), dp=gpus, moe_recompute=True)
        plan = plan_forward(m, layout, assume, backend, keys=tokens)
        carried = carried_bytes(m, tokens)
    weights = sum(plan.breakdown.get(k, 0) for k in ("weights", "root_gathered", "layer_gathered"))
    parts = {"weights": weights, **carried, "activations": plan.peak_bytes - weights}
    return ForwardPlan(sum(parts.values()), plan.peak_where, parts, plan.weights_bytes)


def longest_region(m: ModelShape, chunk: int, limit: int, gpus: int = 1, cp: int = 1,
                   assume: Assumptions | None = None, backend: str = "fla", memory: MemoryConfig | None = None) -> int:
    """The most tokens (a multiple of `cp`, below 2^34) whose `plan_score` peak is at most `limit` bytes;
    0 when not even `chunk` tokens fit."""

    def too_big(k: int) -> bool:  # k: tokens in units of cp
        return plan_score(m, k * cp, chunk, gpus, cp, assume, backend, memory).peak_bytes > limit

    start = max(1, -(-min(chunk, 2**20) // cp))
    if too_big(start):
        return 0
    return (start + bisect.bisect_left(range(start + 1, 2**34 // cp), True, key=too_big)) * cp
