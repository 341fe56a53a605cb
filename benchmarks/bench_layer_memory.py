"""What one decoder layer at GLM-5.3-Flash widths saves for backward, measured against the planner.

For each layer kind (KDA+MoE, KDA+dense, DSA+MoE) a one-layer model of preset `glm53-flash`
(hidden 4096, 64 KDA heads x 128, MLA and indexer as the real model; only the routed experts cut
to `--experts`, vocabulary 16) is built on CPU in bf16 with upstream's float32 exceptions (how
the trainer computes, docs/precision.md), the long-context classes installed with MoE recompute
on (`apply_long_context(moe_recompute=True)`, the other settings the trainer's defaults), and
run forward + backward on T tokens (`--T`, default 4096), each kind in its own subprocess.

- saved: every storage autograd keeps during the layer's forward (`saved_tensors_hooks`),
  parameters excluded, each storage counted once (by its untyped storage's data_ptr), the way
  `tests/plan/test_activations.py` counts; bytes per token = saved / T.
- predicted: the planner's `activations.layer_input + layer_body` for the same layer shape and
  layout (`genome_lm/plan/activations.py`, backend "torch": the CPU op), per term.
- top: the biggest saved storages (shape, dtype, bytes, the module that was running and the
  `grad_fn` of the tensor, i.e. the op that created it) so the savings can be targeted.
- peak: resident-set high-water mark above the resident size before the forward (VmHWM, reset
  just before; every allocator counts), for the forward alone and for forward + backward.

    python benchmarks/bench_layer_memory.py                       # T = 4096, all three kinds
    python benchmarks/bench_layer_memory.py --T 1024 --kinds kda+moe --label lean_ops

Results are kept per `--label` (default "current"): a run replaces the rows of its kinds under
its label in benchmarks/results/bench_layer_memory.json and leaves the rest, so runs with different
ops sit side by side. Prints a table. Not a test.

The committed JSON holds two labels. `without_lean_ops`: the layers without the lean KDA
internals, RMSNorms, hyper-connection recompute and dense MLP (KDA+MoE 644,129 bytes per token
measured, 644,056 predicted). `lean_ops`: with the lean KDA internals, RMSNorms and
hyper-connection recompute (`ops/kda/{conv,gate,norm}.py`, `ops/norm`, `ops/hc`) and, for
KDA+dense, the lean dense MLP (`ops/mlp`: 430,809 -> 332,505 of it); DSA+MoE with
`--dsa-block-queries 256` (a 1024-query block needs ~18 GB of this 23 GB machine; the saved
bytes are the same).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "bench_layer_memory.json"
KINDS = {  # kind: (layer_types entry, mlp_layer_types entry)
    "kda+moe": ("linear_attention", "sparse"),
    "kda+dense": ("linear_attention", "dense"),
    "dsa+moe": ("indexed_attention", "sparse"),
}


def build_layer_model(kind: str, experts: int, top_k: int, dsa_block_queries: int | None = None):
    """A one-layer glm53-flash causal LM of `kind` on CPU, bf16 with upstream's float32 exceptions,
    initialised as upstream initialises (random), long-context classes installed, MoE recompute on.
    Returns the model and the `LongContextSettings` installed."""
    import dataclasses

    import torch

    from genome_lm.model import apply_long_context, build
    from genome_lm.settings import DEFAULTS

    attn, mlp = KINDS[kind]
    model = build("glm53-flash", dtype=torch.bfloat16, meta=True, num_hidden_layers=1, layer_types=[attn],
                  mlp_layer_types=[mlp], indexer_types=["full"], n_routed_experts=experts,
                  num_experts_per_tok=top_k, vocab_size=16).model
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.model.apply(model.model._init_weights)
        torch.nn.init.normal_(model.lm_head.weight, std=model.config.initializer_range)
        for name, p in model.named_parameters():  # upstream leaves these torch.empty
            if name.endswith("forget_gate.dt_bias"):
                p.uniform_(-6.9, -2.3)
            elif name.endswith("forget_gate.A_log"):
                p.zero_()
    blocks = {} if dsa_block_queries is None else {"dsa_block_queries": dsa_block_queries}
    settings = dataclasses.replace(DEFAULTS, moe_recompute=True, **blocks)
    apply_long_context(model, settings)
    return model, settings


class SavedTensors:
    """Records every storage autograd saves inside the context, parameters excluded, each once."""

    def __init__(self, model):
        import torch

        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.entries: dict[int, dict] = {}  # data_ptr -> entry
        self.keep = []  # saved tensors stay referenced: no recorded address is reused
        self.stack = ["<outside>"]
        names = {m: n or "<root>" for n, m in model.named_modules()}
        self.hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(
                lambda mod, args: self.stack.append(names.get(mod, type(mod).__name__))),
            torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: self.stack.pop() and None),
        ]
        self.layer = [-1]
        for i, layer in enumerate(model.model.layers):
            self.hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: self.layer.__setitem__(0, i)))
            self.hooks.append(layer.register_forward_hook(lambda m, a, o: self.layer.__setitem__(0, -1)))
        self.context = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, t):
        self.keep.append(t)
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self.params and ptr not in self.entries and st.nbytes():
            self.entries[ptr] = {
                "layer": self.layer[0], "module": self.stack[-1], "shape": list(t.shape), "dtype": str(t.dtype)[6:],
                "bytes": st.nbytes(), "grad_fn": type(t.grad_fn).__name__ if t.grad_fn is not None else None,
            }
        return t

    def __enter__(self):
        self.context.__enter__()
        return self

    def __exit__(self, *exc):
        self.context.__exit__(*exc)
        for h in self.hooks:
            h.remove()

    def of_layer(self, index: int) -> list[dict]:
        return sorted((e for e in self.entries.values() if e["layer"] == index), key=lambda e: -e["bytes"])


def predicted(model, s, T: int) -> dict[str, int]:
    """The planner's saved bytes for layer 0 of `model`, installed with settings `s`, at T tokens, per
    term (layer input included)."""
    from genome_lm.plan import activations
    from genome_lm.plan.layout import Layout
    from genome_lm.plan.shapes import shape_of

    m = shape_of(model, "glm53-flash", "bfloat16")
    layout = Layout(T, hc_recompute=True, kda_chunk=s.kda_chunk_size).replace(
        moe_recompute=True, moe_block_tokens=s.moe_block_tokens, dsa_block_queries=s.dsa_block_queries,
        loss_chunk_tokens=s.loss_chunk_tokens)
    body = activations.layer_body(m, m.layers[0], layout, backend="torch", imbalance=1.0)
    body.pop("dsa_selection", None)  # kept by the attention's context object, not through autograd
    return {"layer_input": activations.layer_input(m, T), **body}


def worker(kind: str, T: int, experts: int, top_k: int, top: int, dsa_block_queries: int | None) -> dict:
    """One kind, in this process: saved bytes by storage, the planner's terms, peak resident memory."""
    import torch

    from genome_lm.train.metrics import proc_status_kb, reset_rss_peak

    model, settings = build_layer_model(kind, experts, top_k, dsa_block_queries)
    ids = torch.randint(0, 4, (1, T), generator=torch.Generator().manual_seed(0))
    rss0 = proc_status_kb("VmRSS")
    reset = reset_rss_peak()
    t0 = time.perf_counter()
    with SavedTensors(model) as saved:
        loss = model(ids, labels=ids).loss
    t1 = time.perf_counter()
    fwd_hwm = proc_status_kb("VmHWM")
    saved.keep.clear()
    loss.backward()
    t2 = time.perf_counter()
    hwm = proc_status_kb("VmHWM")
    mine = saved.of_layer(0)
    measured = sum(e["bytes"] for e in mine)
    terms = predicted(model, settings, T)
    pred = sum(terms.values())
    by_module: dict[str, int] = {}
    for e in mine:
        by_module[e["module"]] = by_module.get(e["module"], 0) + e["bytes"]
    kib = lambda kb: None if not reset or kb is None or rss0 is None else (kb - rss0) * 1024  # noqa: E731
    return {
        "kind": kind, "T": T, "experts": experts, "top_k": top_k, "threads": torch.get_num_threads(),
        "dsa_block_queries": settings.dsa_block_queries,
        "saved_bytes_per_token": measured / T, "predicted_bytes_per_token": pred / T,
        "predicted_over_measured": pred / measured,
        "predicted_terms_per_token": {k: v / T for k, v in terms.items()},
        "saved_by_module_per_token": {k: v / T for k, v in sorted(by_module.items(), key=lambda kv: -kv[1])},
        "saved_by_dtype_per_token": {d: sum(e["bytes"] for e in mine if e["dtype"] == d) / T
                                     for d in sorted({e["dtype"] for e in mine})},
        "saved_outside_layer_per_token": sum(e["bytes"] for e in saved.entries.values() if e["layer"] != 0) / T,
        "top": [dict(e, bytes_per_token=e["bytes"] / T) for e in mine[:top]],
        "n_saved_storages": len(mine),
        "peak_fwd_bytes": kib(fwd_hwm), "peak_fwd_bwd_bytes": kib(hwm),
        "fwd_s": t1 - t0, "bwd_s": t2 - t1,
    }


def run_one(kind: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--T", str(args.T), "--experts", str(args.experts),
           "--top-k", str(args.top_k), "--top", str(args.top), "--threads", str(args.threads)]
    if args.dsa_block_queries is not None:
        cmd += ["--dsa-block-queries", str(args.dsa_block_queries)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"kind": kind, "T": args.T, "skipped": f"timeout after {args.timeout} s"}
    if done.returncode != 0:
        return {"kind": kind, "T": args.T, "skipped": f"failed: {done.stderr.strip().splitlines()[-3:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = [f"{'kind':<10}{'T':>6}{'saved B/tok':>13}{'planner B/tok':>15}{'plan/meas':>10}{'fp32 B/tok':>12}"
             f"{'peak fwd MiB':>14}{'peak f+b MiB':>14}"]
    mib = lambda b: f"{b / 2**20:.0f}" if b is not None else "-"  # noqa: E731
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['kind']:<10}{r['T']:>6}  {r['skipped']}")
            continue
        fp32 = r["saved_by_dtype_per_token"].get("float32", 0)
        lines.append(f"{r['kind']:<10}{r['T']:>6}{r['saved_bytes_per_token']:>13,.0f}"
                     f"{r['predicted_bytes_per_token']:>15,.0f}{r['predicted_over_measured']:>10.4f}{fp32:>12,.0f}"
                     f"{mib(r['peak_fwd_bytes']):>14}{mib(r['peak_fwd_bwd_bytes']):>14}")
    return "\n".join(lines)


def breakdown(rows: list[dict], n: int = 12) -> str:
    lines = []
    for r in rows:
        if "skipped" in r:
            continue
        lines.append(f"\n{r['kind']}: biggest saved storages (bytes per token)")
        for e in r["top"][:n]:
            lines.append(f"  {e['bytes_per_token']:>9,.0f}  {e['dtype']:<9}{str(e['shape']):<22}"
                         f"{e['module']:<42}{e['grad_fn']}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, default=4096, help="tokens (one sequence)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--experts", type=int, default=8, help="routed experts (flash: 288)")
    p.add_argument("--top-k", type=int, default=8, help="experts per token (flash: 8)")
    p.add_argument("--top", type=int, default=24, help="biggest saved storages kept per kind")
    p.add_argument("--dsa-block-queries", type=int, default=None,
                   help="queries per DSA block (default: the trainer's); saved bytes do not depend on it, the "
                        "peak does (a 1024-query block at flash widths needs ~18 GB on CPU)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--label", default="current", help="name of this run in the JSON (e.g. lean_ops)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--worker", metavar="KIND", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(worker(args.worker, args.T, args.experts, args.top_k, args.top, args.dsa_block_queries)))
        return

    rows = []
    for kind in args.kinds:
        rows.append(run_one(kind, args))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    data = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    config = {k: v for k, v in vars(args).items() if k not in ("worker", "out", "kinds")}
    kept = [r for r in data["runs"].get(args.label, {}).get("results", []) if r["kind"] not in args.kinds]
    rows = sorted(kept + rows, key=lambda r: list(KINDS).index(r["kind"]))
    data["runs"][args.label] = {"config": config, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(args.out)
    print(table(rows))
    print(breakdown([r for r in rows if r["kind"] in args.kinds]))


if __name__ == "__main__":
    main()
