"""`genome-lm plan` and `genome-lm rehearse`: argument handling and output (plans as JSON for scripts and as a
readable report for people); `cli.py` only registers them (the usage of each: docs/plan.md).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from typing import Literal

from pydantic import Field

from genome_lm.errors import GenomeLMError
from genome_lm.options import Params
from genome_lm.plan.hardware import GB, GiB
from genome_lm.settings import STREAMING_CHUNK_TOKENS
from genome_lm.sizes import Size


class PlanParams(Params):
    """The parameters of `genome-lm plan`: a run from an experiment YAML or from --model/--seq-len,
    with layout and cluster flags overriding it."""

    experiment: str | None = Field(default=None, json_schema_extra={"positional": True}, description="experiment "
                                   "YAML (its model, data.seq_len, memory and parallel sections)")
    model: str | None = Field(default=None, description="preset (glm53-flash, glm53-mini, glm53-demo, glm53-tiny) or "
                              "checkpoint directory, instead of an experiment")
    seq_len: Size | None = Field(default=None, description="tokens per sequence, e.g. 1M or 256k (overrides the "
                                 "experiment's data.seq_len)")
    dtype: Literal["bfloat16", "float32"] | None = Field(default=None, description="model dtype (default: the "
                                                         "experiment's, else bfloat16)")
    gpus: int | None = Field(default=None, ge=1, description="GPUs in the job (default: the experiment's cp x dp)")
    gpus_per_node: int | None = Field(default=None, ge=1, description="GPUs per node (default 8)")
    gpu: str = Field(default="b200", description="b200, h200 or h100")
    gpu_mem: Size | None = Field(default=None, description="usable memory per GPU, e.g. 180GiB or 141GB (G = GiB, "
                                 "GB = 10^9 bytes; default: the GPU's)")
    host_mem: Size | None = Field(default=None, description="host memory per node, e.g. 2TiB (default 2 TiB)")
    cp: int | None = Field(default=None, ge=1, description="context-parallel ranks (default: experiment's, else 1)")
    ep: int | Literal["auto"] | None = Field(default=None, description="expert-parallel ranks (default: the "
                                             "experiment's parallel.ep, else 1; --fit tries every ep that divides "
                                             "the GPUs and the experts up to a node unless --ep N fixes one)")
    recompute: Literal["none", "per-layer"] | None = Field(default=None, description="recompute policy (overrides)")
    offload: bool | None = Field(default=None, description="offload layer inputs to host memory")
    overrides: list[str] = Field(default=[], json_schema_extra={"flag": "--set", "repeat": True, "metavar": "KEY=V"},
                                 description="override an experiment value, e.g. --set memory.dsa_block_queries=512 "
                                 "(repeatable)")
    assume: list[str] = Field(default=[], json_schema_extra={"repeat": True, "metavar": "KEY=VALUE"},
                              description="override a planner assumption, e.g. --assume matmul_efficiency=0.35, or "
                              "take those a GPU measured: --assume benchmarks/results/gpu_check.json (repeatable)")
    fit: bool = Field(default=False, description="search recompute/offload/cp/block sizes for the fastest layout that "
                      "fits")
    score: Size | None = Field(default=None, description="plan scoring a region of this many tokens instead of "
                               "training (genome-lm score): peak per GPU split into weights, KDA state, DSA caches "
                               "and activations, and the longest region that fits")
    chunk: Size = Field(default=STREAMING_CHUNK_TOKENS, ge=1, description="with --score: tokens per streamed chunk "
                        "(one process or FSDP2 over --gpus; with --cp > 1 the region is one piece over the CP ranks)")
    json_: bool = Field(default=False, json_schema_extra={"flag": "--json"},
                        description="print JSON instead of the report")


class RehearseParams(Params):
    """The parameters of `genome-lm rehearse`: an experiment on N fake ranks, with the planner's
    prediction for the same run beside the measured figures."""

    experiment: str = Field(json_schema_extra={"positional": True}, description="experiment YAML")
    gpus: int = Field(ge=1, description="ranks of the fake process group (the experiment's dp becomes gpus / cp)")
    gpu: str = Field(default="b200", description="the GPU the planner's prediction is for: b200, h200 or h100")
    routing: Literal["busiest", "uniform"] = Field(default="busiest", description="routing assumed under expert "
                                                   "parallelism: this rank receives expert_imbalance x the mean "
                                                   "rows (the planner's assumption), or the mean")
    layers: int | Literal["all"] | None = Field(default=None, description="decoder layers to run (default: the "
                                                "first ones holding every layer kind, the rest added from their "
                                                "shards; 'all': every layer)")
    steps: int = Field(default=2, ge=2, description="training steps (the peak is taken after the first)")
    overrides: list[str] = Field(default=[], json_schema_extra={"flag": "--set", "repeat": True, "metavar": "KEY=V"},
                                 description="override an experiment value, e.g. --set data.seq_len=32k (repeatable)")
    assume: list[str] = Field(default=[], json_schema_extra={"repeat": True, "metavar": "KEY=VALUE"},
                              description="override a planner assumption (as genome-lm plan --assume); "
                              "expert_imbalance also sets the routing of --routing busiest")


def _experiment(args):
    """An ExperimentConfig from the YAML or from --model/--seq-len (trainer defaults elsewhere)."""
    from genome_lm.config import load_experiment, parse_experiment
    from genome_lm.options import apply_override

    if args.experiment and args.model:
        raise GenomeLMError("plan: give an experiment file or --model, not both")
    overrides = list(args.overrides)
    if args.seq_len is not None:
        overrides.append(f"data.seq_len={args.seq_len}")
    if args.experiment:
        return load_experiment(args.experiment, overrides)
    if not args.model:
        raise GenomeLMError("plan: give an experiment file (e.g. experiments/glm53flash_1m_64xb200.yaml) "
                            "or --model PRESET")
    if args.seq_len is None:
        raise GenomeLMError("plan: --model needs --seq-len (e.g. --seq-len 1M)")
    raw = {"data": {"shards": "-", "seq_len": args.seq_len},
           "model": {"name": args.model, "dtype": args.dtype or "bfloat16"},
           "train": {"steps": 1}, "parallel": {"cp": 1, "dp": "auto"}}
    for item in args.overrides:
        apply_override(raw, item)
    return parse_experiment(raw, "plan arguments")


def build(args):
    """(model shape, given layout, cluster, assumptions, ep degrees for --fit) from the arguments; the ep
    degrees are None (the search's default: every one worth trying) unless --ep N fixes one."""
    from genome_lm.plan.hardware import Assumptions, make_cluster
    from genome_lm.plan.layout import Layout
    from genome_lm.plan.shapes import model_shape
    cfg = _experiment(args)
    if args.cp is not None:
        cfg.parallel.cp = args.cp
        cfg.parallel.dp = "auto"
    gpus = args.gpus
    if gpus is None:
        if cfg.parallel.dp == "auto":
            raise GenomeLMError("plan: --gpus is required (the experiment's parallel.dp is auto)" if args.experiment
                                else f"plan --model {args.model}: give --gpus N (with --model, the layout is data "
                                "parallel over N GPUs)")
        gpus = cfg.parallel.cp * cfg.parallel.dp
    cluster = make_cluster(args.gpu, gpus, args.gpus_per_node, args.gpu_mem, args.host_mem)
    if gpus % cfg.parallel.cp:
        raise GenomeLMError(f"--cp {cfg.parallel.cp} does not divide --gpus {gpus}")
    if isinstance(args.ep, int) and (args.ep < 1 or gpus % args.ep):
        raise GenomeLMError(f"--ep {args.ep} must be a positive divisor of --gpus {gpus}")
    dp = gpus // cfg.parallel.cp  # --gpus wins over the experiment's dp
    layout = Layout(cfg.data.seq_len, cfg.memory, cfg.parallel.model_copy(update={"dp": dp}), cfg.train)
    flags = {"recompute": args.recompute, "recompute_layers": [] if args.recompute else None,
             "offload_layer_inputs": args.offload, "ep": 1 if args.ep == "auto" else args.ep}
    layout = layout.replace(**{k: v for k, v in flags.items() if v is not None})  # make_plan checks it
    # the experiment's checkpoint mode unless --assume checkpoint_async says otherwise
    assume = Assumptions(checkpoint_async=cfg.train.checkpoint_mode == "async").override(args.assume)
    shape = model_shape(cfg.model.name, args.dtype or cfg.model.dtype, cfg.model.overrides)
    return shape, layout, cluster, assume, (args.ep,) if isinstance(args.ep, int) else None


def run_score(args: PlanParams, tokens: int) -> None:
    """`plan --score`: the peak per GPU of a scoring run and the longest region that fits."""
    from genome_lm.plan.hardware import Assumptions, make_cluster
    from genome_lm.plan.memory import longest_region, plan_score
    from genome_lm.plan.shapes import model_shape

    if args.fit or args.seq_len is not None:
        raise GenomeLMError("plan --score: --fit and --seq-len are for training plans; --score gives the length")
    gpus, cp = args.gpus or 1, args.cp or 1
    if gpus % cp:
        raise GenomeLMError(f"--cp {cp} does not divide --gpus {gpus}")
    cfg = _experiment(args.model_copy(update={"seq_len": tokens}))  # its model and memory (block sizes, --set)
    shape = model_shape(cfg.model.name, args.dtype or cfg.model.dtype, cfg.model.overrides)
    cluster = make_cluster(args.gpu, gpus, args.gpus_per_node, args.gpu_mem, args.host_mem)
    assume = Assumptions().override(args.assume)
    plan = plan_score(shape, tokens, args.chunk, gpus, cp, assume, memory=cfg.memory)
    limit = int((cluster.gpu.memory_bytes - assume.runtime_reserved_gib * GiB) / (1 + assume.fragmentation))
    longest = longest_region(shape, args.chunk, limit, gpus, cp, assume, memory=cfg.memory)
    how = f"one piece over {cp} context-parallel ranks" if cp > 1 else f"streamed in chunks of {args.chunk:,}"
    if args.json_:
        print(json.dumps({"tokens": tokens, "chunk": args.chunk, "gpus": gpus, "cp": cp, "gpu": cluster.gpu.name,
                          "peak_bytes": plan.peak_bytes, "peak_where": plan.peak_where, "breakdown": plan.breakdown,
                          "usable_bytes": limit, "fits": plan.peak_bytes <= limit, "longest_region": longest},
                         indent=2))
        return
    print(f"scoring {tokens:,} tokens of {cfg.model.name} ({shape.dtype}), {how}, on {gpus} x {cluster.gpu.name}")
    for key, label in (("weights", "weights"), ("kda_state", "KDA state"), ("dsa_caches", "DSA caches"),
                       ("activations", "activations")):
        print(f"  {label:<12} {plan.breakdown[key] / GiB:>10,.2f} GiB")
    print(f"peak per GPU: {plan.peak_bytes / GiB:,.2f} GiB at {plan.peak_where}; usable {limit / GiB:,.1f} GiB "
          f"(after {assume.fragmentation:.0%} allocator overhead and {assume.runtime_reserved_gib:g} GiB runtime): "
          + ("fits" if plan.peak_bytes <= limit else "does not fit"))
    print(f"longest region that fits: {longest:,} tokens" if longest else
          "longest region that fits: none (not even one chunk); add GPUs (--gpus) or shorten --chunk")


def run(args: PlanParams) -> None:
    from genome_lm.plan.planner import fit, make_plan

    if args.score is not None:
        run_score(args, args.score)
        return
    if not args.fit:
        plan = make_plan(*build(args)[:4])
        print(json.dumps(plan_json(plan), indent=2) if args.json_ else format_plan(plan))
        return
    result = fit(*build(args))  # as benchmarks/plan_table.py asks it
    chosen = result.best or result.closest
    assert chosen is not None  # closest is set when nothing fits
    search = {"found": result.best is not None, "tried": result.tried, "explanation": result.explain(),
              "chosen": chosen.layout.describe(),
              "given": {"layout": result.given.layout.describe(), "fits": result.given.fits,
                        "peak_gpu_bytes": result.given.peak_gpu_bytes, "problems": result.given.problems}}
    print(json.dumps(plan_json(chosen) | {"fit": search}, indent=2) if args.json_
          else "\n".join(result.explain() + ["", format_plan(chosen)]))
    if result.best is None:
        raise GenomeLMError(f"plan --fit: nothing fits among {result.tried} layouts (the lowest peak is shown above)")


def run_rehearse(args: RehearseParams) -> None:
    from genome_lm.config import load_experiment
    from genome_lm.plan.planner import make_plan
    from genome_lm.plan.rehearse import format_rehearsal, rehearse

    assume = [*args.assume, "expert_imbalance=1"] if args.routing == "uniform" else args.assume
    plan = make_plan(*build(PlanParams(experiment=args.experiment, overrides=args.overrides, gpus=args.gpus,
                                       gpu=args.gpu, assume=assume))[:4])
    # the experiment as the rehearsal runs it: `--set` applied, dp resolved for --gpus (as `plan` does)
    cfg = load_experiment(args.experiment, list(args.overrides))  # `build` has checked that cp divides --gpus
    cfg.parallel.dp = "auto"
    if cfg.model.dtype == "float32" and cfg.parallel.ep == 1 and any(lay.mlp == "moe" for lay in plan.model.layers):
        raise GenomeLMError(f"rehearse {args.experiment}: model.dtype is float32, and without expert parallelism the "
                            "routed experts run torch's grouped matmul (aten._grouped_mm), which takes bfloat16 "
                            "inputs only on fake tensors; rehearse it with --set model.dtype=bfloat16 (or "
                            "parallel.ep > 1)")
    layers = plan.model.n_layers if args.layers == "all" else args.layers
    print(format_rehearsal(rehearse(cfg, args.gpus, args.routing, layers, args.steps, args.experiment, plan=plan)))


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
    lay, mem, c, t = plan.layout, plan.memory, plan.cluster, plan.time
    return {
        "model": {"name": plan.model.name, "dtype": plan.model.dtype, "parameters": plan.model.counts,
                  "layers": dict(sorted(Counter(x.kind for x in plan.model.layers).items()))},
        "device": plan.device,
        "layout": lay.to_json(),
        "fits": plan.fits,
        "problems": plan.problems,
        "notes": plan.notes,
        "peak_gpu_bytes": plan.peak_gpu_bytes,
        "peak_gpu_gib": gib(plan.peak_gpu_bytes),
        "peak_where": mem.peak_where,
        "needed_gpu_gib": gib(plan.needed_gpu_bytes),
        "breakdown": mem.breakdown,
        "host_bytes_per_gpu": plan.host_bytes_per_gpu,
        "host_bytes_per_node": plan.host_bytes_per_gpu * c.gpus_per_node,
        "activations_per_layer_bytes": mem.activations_by_layer_type,
        "kept_per_layer_bytes": mem.kept_by_layer_type,
        "largest_phases": [{"where": w, "bytes": b} for w, b in mem.phases[:5]],
        "step_time_s": plan.step_time_s,
        "tokens_per_s": plan.tokens_per_s,
        "assumptions": plan.assume.model_dump(),
        "cluster": {"gpu": c.gpu.name, "gpus": c.gpus, "gpus_per_node": c.gpus_per_node, "nodes": c.nodes,
                    "gpu_memory_bytes": c.gpu.memory_bytes, "host_memory_per_node_bytes": c.host_memory_per_node},
        "time_breakdown_s": t.parts_s,
        "flops_per_gpu_per_step": t.flops_per_step,
        "model_flops_per_token": t.model_flops_per_token,
        "checkpoint": asdict(plan.checkpoint),
    }


def format_plan(plan) -> str:
    """A readable report of a plan on a cluster (`build` always gives one): verdict, memory breakdown at the
    peak, host memory, checkpoints, time, assumptions."""
    lay, mem, m, c, ck, t = plan.layout, plan.memory, plan.model, plan.cluster, plan.checkpoint, plan.time
    lines = [f"plan: {m.name} ({m.dtype}, {_count(m.counts.get('total', 0))} parameters, "
             f"{_count(m.counts.get('active', 0))} active) at {lay.seq_len:,} tokens on {c.gpus} x {c.gpu.name}",
             f"layout: {lay.describe()}  ({lay.tokens:,} tokens per GPU)",
             "verdict: " + ("FITS" if plan.fits else "DOES NOT FIT: " + "; ".join(plan.problems)), "",
             f"peak per GPU: {gib(plan.peak_gpu_bytes):,.1f} GiB at {mem.peak_where}"]
    lines += [f"  {LABELS.get(key, key):<46} {gib(value):>9,.2f} GiB"
              for key, value in sorted(mem.breakdown.items(), key=lambda kv: -kv[1])]
    lines.append(f"  with {plan.assume.fragmentation:.0%} allocator overhead and {plan.assume.runtime_reserved_gib:g} "
                 f"GiB runtime: needs {gib(plan.needed_gpu_bytes):,.1f} of {gib(c.gpu.memory_bytes):,.1f} GiB per GPU")
    lines.append("activations of one layer without recompute / kept between forward and backward:")
    lines += [f"  {kind:<12} {gib(full):>9,.2f} GiB / {gib(mem.kept_by_layer_type[kind]):>8,.2f} GiB"
              for kind, full in mem.activations_by_layer_type.items()]
    host, staging = plan.host_bytes_per_gpu, ck.staging_host_bytes_per_gpu
    lines += [f"host memory (pinned, offloaded layer inputs): {gib(host):,.1f} GiB ({host / 1e9:,.1f} GB) per GPU, "
              f"{gib(host * c.gpus_per_node):,.0f} GiB per node (of {gib(c.host_memory_per_node):,.0f})",
              f"host memory (pinned, async checkpoint staging): {gib(staging):,.1f} GiB per GPU; with offload's "
              f"{gib((host + staging) * c.gpus_per_node):,.0f} GiB per node "
              f"(usable {gib(c.host_memory_per_node * plan.assume.host_usable_fraction):,.0f})",
              f"checkpoint ({'async (staged in pinned host memory)' if ck.asynchronous else 'sync'}): train_state "
              f"{ck.train_state_bytes / 1e12:,.2f} TB ({ck.state_bytes_per_gpu / GB:,.1f} GB per GPU), model/ "
              f"{ck.export_bytes / 1e12:,.2f} TB when exported; training stalls {ck.stall_s:,.1f} s per "
              f"checkpoint, the write takes {ck.write_s:,.0f} s at {plan.assume.checkpoint_write_gbps:g} GB/s "
              "(--assume checkpoint_write_gbps)",
              "", f"step time: {t.step_time_s:,.2f} s  ->  {t.tokens_per_s:,.0f} tokens/s for the cluster"]
    lines += [f"  {key:<20} {value:>8.2f} s" for key, value in sorted(t.parts_s.items(), key=lambda kv: -kv[1])
              if value > 0]
    lines += [f"note: {note}" for note in plan.notes] + ["", "assumptions (override with --assume KEY=VALUE):"]
    lines += [f"  {key} = {value}" for key, value in plan.assume.model_dump().items()]
    return "\n".join(lines)
