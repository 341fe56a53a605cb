"""The docs/plan.md table: GLM-5.3-Flash at 128k-1M tokens on 8-64 B200s and H200s, `--fit` layouts.

For every (GPU, GPU count, sequence length) the planner's `--fit` search runs twice: without
expert parallelism (ep = 1: experts sharded by FSDP2 like every other weight) and with it allowed
(`parallel.ep` in 1, 2, 4, 8). The starting layout is experiments/glm53flash_1m_64xb200.yaml's
(block sizes, bf16 reduce-scatter and AdamW moments, offload, KDA head blocks), with each row's
sequence length, cp and dp. Writes benchmarks/results/plan_table.json
and prints two markdown tables (no GPU needed; a few seconds per row).

    python benchmarks/plan_table.py [--gpus-list 8,16,32,64] [--seqs 128k,256k,512k,1M]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    from genome_lm.config import load_experiment
    from genome_lm.plan import Assumptions, fit, make_cluster, model_shape
    from genome_lm.plan.layout import layout_from_config
    from genome_lm.plan.report import format_table, gib
    from genome_lm.sizes import format_size, parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus-list", default="8,16,32,64")
    ap.add_argument("--seqs", default="128k,256k,512k,1M")
    ap.add_argument("--gpu-types", default="b200,h200")
    ap.add_argument("--json", default=str(HERE / "results" / "plan_table.json"))
    args = ap.parse_args()

    # the experiments' layout (blocks, dtypes, offload, head blocks), re-sized per row
    start = layout_from_config(load_experiment(str(HERE.parent / "experiments" / "glm53flash_1m_64xb200.yaml")), 64)
    shape = model_shape("glm53-flash", "bfloat16")
    assume = Assumptions()
    rows = []
    for variant, eps in (("ep=1", (1,)), ("ep allowed (1-8)", (1, 2, 4, 8))):
        for gpu in args.gpu_types.split(","):
            for gpus in (int(g) for g in args.gpus_list.split(",")):
                for seq in (parse_size(s) for s in args.seqs.split(",")):
                    t0 = time.perf_counter()
                    cluster = make_cluster(gpu, gpus)
                    cp = min(8, gpus)
                    given = start.replace(seq_len=seq, cp=cp, dp=gpus // cp, ep=1)
                    result = fit(shape, given, cluster, assume, eps)
                    p = result.best or result.closest
                    rows.append({"variant": variant, "gpu": gpu, "gpus": gpus, "seq": format_size(seq),
                                 "fits": result.best is not None, "peak_gib": gib(p.peak_gpu_bytes),
                                 "host_gib": gib(p.host_bytes_per_gpu),
                                 "staging_gib": gib(p.staging_host_bytes_per_gpu),
                                 "tokens_per_s": p.tokens_per_s or 0.0,
                                 "step_time_s": p.step_time_s, "layout": p.layout.describe(),
                                 "peak_where": p.memory.peak_where, "explanation": result.explain(),
                                 "search_s": round(time.perf_counter() - t0, 2)})
                    r = rows[-1]
                    print(f"{variant:<30} {gpu} x{gpus:<3} {r['seq']:>5}: fits={r['fits']} "
                          f"peak {r['peak_gib']:.1f} GiB "
                          f"host {r['host_gib']:.0f} GiB {r['tokens_per_s']:,.0f} tok/s  {r['layout']}", flush=True)
    out = {"model": "glm53-flash", "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "assumptions": {k: v["value"] for k, v in assume.describe().items()}, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        print(f"\n### {variant}\n")
        print(format_table([r for r in rows if r["variant"] == variant]))
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
