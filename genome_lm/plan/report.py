"""Plans as JSON (for scripts) and as a readable report (for people)."""

from __future__ import annotations

from dataclasses import asdict

from genome_lm.plan.hardware import GiB

LABELS = {
    "parameters": "float32 master weights (FSDP2 shard)",
    "optimizer_states": "AdamW states (shard)",
    "gradients": "float32 gradients (shard, so far)",
    "fsdp_root_unsharded": "embeddings + LM head (unsharded)",
    "fsdp_buffers": "FSDP2 all-gather / reduce-scatter buffers",
    "kept_activations": "kept by earlier layers for backward",
    "current_layer": "current layer: its saved tensors",
    "op_transient": "transient of the running op",
    "grad_streams": "stream gradients (in/out)",
    "inputs": "input ids + labels",
    "final": "final norm + hidden + targets",
    "loss_chunk": "LM head / cross-entropy chunk",
    "optimizer_temp": "AdamW step temporaries",
}


def gib(n: float) -> float:
    return round(n / GiB, 2)


def _count(n: int) -> str:
    return f"{n / 1e9:,.1f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M"


def plan_json(plan) -> dict:
    lay, mem = plan.layout, plan.memory
    out = {
        "model": {"name": plan.model.name, "dtype": plan.model.dtype, "parameters": plan.model.counts,
                  "layers": {k: sum(1 for x in plan.model.layers if x.kind == k)
                             for k in sorted({x.kind for x in plan.model.layers})}},
        "device": plan.device,
        "layout": lay.to_json(),
        "fits": plan.fits,
        "problems": plan.problems,
        "notes": plan.notes,
        "peak_gpu_bytes": plan.peak_gpu_bytes,
        "peak_gpu_gib": gib(plan.peak_gpu_bytes),
        "peak_where": mem.peak_where,
        "needed_gpu_gib": gib(plan.needed_gpu_bytes) if plan.cluster else None,
        "breakdown": dict(mem.breakdown) | ({"process_baseline": plan.process_baseline_bytes}
                                            if plan.process_baseline_bytes else {}),
        "host_bytes_per_gpu": plan.host_bytes_per_gpu,
        "host_bytes_per_node": plan.host_bytes_per_gpu * (plan.cluster.gpus_per_node if plan.cluster else 1),
        "activations_per_layer_bytes": mem.activations_by_layer_type,
        "kept_per_layer_bytes": mem.kept_by_layer_type,
        "largest_phases": [{"where": w, "bytes": b} for w, b in mem.phases[:5]],
        "step_time_s": plan.step_time_s,
        "tokens_per_s": plan.tokens_per_s,
        "assumptions": plan.assume.model_dump(),
    }
    if plan.cluster is not None:
        c = plan.cluster
        out["cluster"] = {"gpu": c.gpu.name, "gpus": c.gpus, "gpus_per_node": c.gpus_per_node, "nodes": c.nodes,
                          "gpu_memory_bytes": c.gpu.memory_bytes, "host_memory_per_node_bytes": c.host_memory_per_node}
        out["time_breakdown_s"] = plan.time.parts_s
        out["flops_per_gpu_per_step"] = plan.time.flops_per_step
        out["model_flops_per_token"] = plan.time.model_flops_per_token
        out["checkpoint"] = asdict(plan.checkpoint)
    return out


def format_plan(plan) -> str:
    """A readable report: verdict, memory breakdown at the peak, host memory, time, assumptions."""
    lay, mem, m = plan.layout, plan.memory, plan.model
    where = f"{plan.cluster.gpus} x {plan.cluster.gpu.name}" if plan.cluster else "CPU"
    lines = [f"plan: {m.name} ({m.dtype}, {_count(m.counts.get('total', 0))} parameters, "
             f"{_count(m.counts.get('active', 0))} active) at {lay.seq_len:,} tokens on {where}",
             f"layout: {lay.describe()}  ({lay.tokens:,} tokens per GPU)",
             "verdict: " + ("FITS" if plan.fits else "DOES NOT FIT: " + "; ".join(plan.problems)), "",
             f"peak per GPU: {gib(plan.peak_gpu_bytes):,.1f} GiB at {mem.peak_where}"]
    lines += [f"  {LABELS.get(key, key):<46} {gib(value):>9,.2f} GiB"
              for key, value in sorted(mem.breakdown.items(), key=lambda kv: -kv[1])]
    if plan.process_baseline_bytes:
        lines.append(f"  {'process baseline (measured)':<46} {gib(plan.process_baseline_bytes):>9,.2f} GiB")
    if plan.cluster is not None:
        lines.append(f"  with {plan.assume.fragmentation:.0%} allocator overhead and "
                     f"{plan.assume.runtime_reserved_gib:g} GiB runtime: needs {gib(plan.needed_gpu_bytes):,.1f} "
                     f"of {gib(plan.cluster.gpu.memory_bytes):,.1f} GiB per GPU")
    lines.append("activations of one layer without recompute / kept between forward and backward:")
    lines += [f"  {kind:<12} {gib(full):>9,.2f} GiB / {gib(mem.kept_by_layer_type[kind]):>8,.2f} GiB"
              for kind, full in mem.activations_by_layer_type.items()]
    host = plan.host_bytes_per_gpu
    lines.append(f"host memory (pinned, offloaded layer inputs): {gib(host):,.1f} GiB ({host / 1e9:,.1f} GB) per GPU"
                 + (f", {gib(host * plan.cluster.gpus_per_node):,.0f} GiB per node "
                    f"(of {gib(plan.cluster.host_memory_per_node):,.0f})" if plan.cluster else ""))
    if plan.checkpoint is not None:
        ck, per_node = plan.checkpoint, plan.cluster.gpus_per_node
        lines.append(f"host memory (pinned, async checkpoint staging): {gib(ck.staging_host_bytes_per_gpu):,.1f} "
                     f"GiB per GPU; with offload's {gib((host + ck.staging_host_bytes_per_gpu) * per_node):,.0f} GiB "
                     "per node "
                     f"(usable {gib(plan.cluster.host_memory_per_node * plan.assume.host_usable_fraction):,.0f})")
        lines.append(ck.describe(plan.assume.checkpoint_write_gbps))
    if plan.time is not None:
        t = plan.time
        lines += ["", f"step time: {t.step_time_s:,.2f} s  ->  {t.tokens_per_s:,.0f} tokens/s for the cluster"]
        lines += [f"  {key:<20} {value:>8.2f} s" for key, value in sorted(t.parts_s.items(), key=lambda kv: -kv[1])
                  if value > 0]
    lines += [f"note: {note}" for note in plan.notes] + ["", "assumptions (override with --assume KEY=VALUE):"]
    lines += [f"  {key} = {value}" for key, value in plan.assume.model_dump().items()]
    return "\n".join(lines)
