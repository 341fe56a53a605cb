"""The docs/plan.md table: GLM-5.3-Flash at 128k-1M tokens on 8-64 B200s and H200s, `--fit` layouts.

Every row asks `genome-lm plan EXPERIMENT --seq-len SEQ --gpus N --gpu GPU --fit` through the command's
own functions (`plan.command.build`, `plan.planner.fit`), so a row and the command choose the same layout: twice,
with expert parallelism fixed at 1 (`--ep 1`: experts sharded by FSDP2 like every other weight) and
with the search's default (ep chosen among the powers of two up to a node). The experiment is
experiments/glm53flash_1m_64xb200.yaml (block sizes, bf16 reduce-scatter and AdamW moments, offload,
KDA head blocks). Writes benchmarks/results/plan_table.json (generated, not committed) and prints two
markdown tables (no GPU needed; a few seconds per row).

    python benchmarks/plan_table.py [--gpus-list 8,16,32,64] [--seqs 128k,256k,512k,1M]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPERIMENT = HERE.parent / "experiments" / "glm53flash_1m_64xb200.yaml"
VARIANTS = {"ep=1": 1, "ep chosen (1-8)": None}


def row(gpu: str, gpus: int, seq: str, ep: int | None) -> dict:
    """One table row: what `plan EXPERIMENT --seq-len seq --gpus gpus --gpu gpu [--ep ep] --fit` chooses."""
    from genome_lm.plan.command import PlanParams, build, gib
    from genome_lm.plan.planner import fit

    t0 = time.perf_counter()
    result = fit(*build(PlanParams(experiment=str(EXPERIMENT), seq_len=seq, gpus=gpus, gpu=gpu, ep=ep, fit=True)))
    p = result.best or result.closest
    assert p is not None and p.checkpoint is not None
    return {"gpu": gpu, "gpus": gpus, "seq": seq, "fits": result.best is not None, "peak_gib": gib(p.peak_gpu_bytes),
            "host_gib": gib(p.host_bytes_per_gpu), "staging_gib": gib(p.checkpoint.staging_host_bytes_per_gpu),
            "tokens_per_s": p.tokens_per_s or 0.0, "step_time_s": p.step_time_s, "layout": p.layout.describe(),
            "peak_where": p.memory.peak_where, "explanation": result.explain(),
            "search_s": round(time.perf_counter() - t0, 2)}


def format_table(rows: list[dict]) -> str:
    """Markdown table of `row`s (docs/plan.md). Rows that do not fit show the
    layout with the lowest peak and no tokens/s."""
    head = ("| GPU | GPUs | seq | fits | peak GiB/GPU | host GiB/GPU | + ckpt staging GiB/GPU | tokens/s | "
            "layout (--fit) |")
    sep = "|---|---:|---:|---|---:|---:|---:|---:|---|"
    body = []
    for r in rows:
        tps = f"{r['tokens_per_s']:,.0f}" if r["fits"] else "–"
        layout = r["layout"] if r["fits"] else f"lowest peak: {r['layout']}"
        body.append(f"| {r['gpu']} | {r['gpus']} | {r['seq']} | {'yes' if r['fits'] else 'no'} | {r['peak_gib']:.1f} | "
                    f"{r['host_gib']:.0f} | {r.get('staging_gib', 0):.0f} | {tps} | {layout} |")
    return "\n".join([head, sep, *body])


def main() -> None:
    from genome_lm.plan.hardware import Assumptions

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus-list", default="8,16,32,64")
    ap.add_argument("--seqs", default="128k,256k,512k,1M")
    ap.add_argument("--gpu-types", default="b200,h200")
    ap.add_argument("--json", default=str(HERE / "results" / "plan_table.json"))
    args = ap.parse_args()

    rows = []
    for variant, ep in VARIANTS.items():
        for gpu in args.gpu_types.split(","):
            for gpus in (int(g) for g in args.gpus_list.split(",")):
                for seq in args.seqs.split(","):
                    r = {"variant": variant} | row(gpu, gpus, seq, ep)
                    rows.append(r)
                    print(f"{variant:<30} {gpu} x{gpus:<3} {seq:>5}: fits={r['fits']} peak {r['peak_gib']:.1f} GiB "
                          f"host {r['host_gib']:.0f} GiB {r['tokens_per_s']:,.0f} tok/s  {r['layout']}", flush=True)
    out = {"model": "glm53-flash", "experiment": EXPERIMENT.name, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "assumptions": Assumptions().model_dump(), "rows": rows}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(path)
    for variant in VARIANTS:
        print(f"\n### {variant}\n")
        print(format_table([r for r in rows if r["variant"] == variant]))
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
