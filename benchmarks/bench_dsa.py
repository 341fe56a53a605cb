"""Forward+backward time and peak memory of one DSA attention layer: upstream vs patched.

A small GLM-5.3-Flash-shaped DSA layer (hidden 256, 8 heads, q_lora 64, kv_lora 64, head
32/32, indexer 4 heads x 32, top-k 256, k-pool 16, tail on), batch 1, fp32, on CPU. Each
(impl, T) runs in its own subprocess so that its peak RSS (resource.ru_maxrss) is its own; the
RSS after building the layer is subtracted as the baseline. Upstream runs where it fits
(default T <= 4k), the patched layer at every T. Wall time and process CPU time are both
recorded (one torch thread by default: on a shared machine CPU time is the steadier number).
Writes benchmarks/results/bench_dsa.json and prints a table.

    python benchmarks/bench_dsa.py [--upstream 1k,2k,4k] [--patched 1k,2k,4k,8k,16k,32k,64k]
                                   [--block 256] [--threads N] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CONFIG = dict(
    hidden_size=256, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=64, kv_lora_rank=64,
    qk_nope_head_dim=32, v_head_dim=32, index_n_heads=4, index_head_dim=32, index_topk=256, index_kpool=16,
    index_kpool_always_select_tail=True, num_hidden_layers=1, layer_types=["indexed_attention"],
    indexer_types=["full"], mlp_layer_types=["dense"], vocab_size=8, pad_token_id=0,
)

WORKER = r"""
import json, resource, sys, time
import torch
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextAttention
from genome_lm.model.ops.dsa import LongDSA
impl, T, block, threads, repeats, cfg_json = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                              int(sys.argv[5]), sys.argv[6])
if threads > 0:
    torch.set_num_threads(threads)
cfg = Glm5NextTextConfig(**json.loads(cfg_json))
cfg._attn_implementation = "eager"
torch.manual_seed(0)
attn = Glm5NextTextAttention(cfg, 0)
if impl == "patched":
    LongDSA.install(attn, block_queries=block)
def step(n):
    x = torch.randn(1, n, cfg.hidden_size, requires_grad=True)
    out, _, _ = attn(x, attention_mask=torch.ones(1, n, dtype=torch.bool))
    out.square().mean().backward()
    attn.zero_grad(set_to_none=True)
step(64)  # warm-up: allocator, lazy init
base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times, cpu = [], []
for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    step(T)
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(dict(impl=impl, T=T, seconds=min(times), cpu_seconds=min(cpu), peak_rss_mib=peak_kb / 1024,
                      extra_rss_mib=(peak_kb - base_kb) / 1024, threads=torch.get_num_threads())))
"""


def parse_lens(text: str) -> list[int]:
    out = []
    for part in filter(None, text.split(",")):
        part = part.strip().lower()
        out.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
    return out


def run_one(impl: str, T: int, args) -> dict:
    cmd = [sys.executable, "-c", WORKER, impl, str(T), str(args.block), str(args.threads), str(args.repeats),
           json.dumps(CONFIG)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    if proc.returncode != 0:
        return dict(impl=impl, T=T, error=proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed",
                    wall_s=time.perf_counter() - t0)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", default="1k,2k,4k")
    ap.add_argument("--patched", default="1k,2k,4k,8k,16k,32k,64k")
    ap.add_argument("--block", type=int, default=256, help="block_queries of the patched layer")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=2, help="timed steps per config; the fastest is reported")
    ap.add_argument("--out", default=str(HERE / "results" / "bench_dsa.json"))
    args = ap.parse_args()

    rows = []
    for impl, lens in (("upstream", parse_lens(args.upstream)), ("patched", parse_lens(args.patched))):
        for T in lens:
            row = run_one(impl, T, args)
            if "seconds" in row:
                row["us_per_token"] = 1e6 * row["seconds"] / T
                row["cpu_us_per_token"] = 1e6 * row["cpu_seconds"] / T
                row["extra_kib_per_token"] = 1024 * row["extra_rss_mib"] / T
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)

    by = {(r["impl"], r["T"]): r for r in rows}
    print(f"\nDSA layer fwd+bwd, fp32 CPU, config: {CONFIG['hidden_size']=} {CONFIG['index_topk']=} "
          f"{CONFIG['index_kpool']=} block={args.block}")
    print(f"{'T':>7} | {'upstream s':>10} {'cpu s':>7} {'MiB':>7} | {'patched s':>9} {'cpu s':>7} {'MiB':>7} "
          f"{'cpu us/tok':>10} {'KiB/tok':>7} | {'cpu speedup':>11}")
    for T in sorted({r["T"] for r in rows}):
        u, p = by.get(("upstream", T)), by.get(("patched", T))
        u = u if u and "seconds" in u else None
        p = p if p and "seconds" in p else None
        us = (f"{u['seconds']:10.2f} {u['cpu_seconds']:7.2f} {u['extra_rss_mib']:7.0f}" if u
              else f"{'-':>10} {'-':>7} {'-':>7}")
        ps = (f"{p['seconds']:9.2f} {p['cpu_seconds']:7.2f} {p['extra_rss_mib']:7.0f} {p['cpu_us_per_token']:10.1f} "
              f"{p['extra_kib_per_token']:7.1f}" if p else f"{'-':>9} {'-':>7} {'-':>7} {'-':>10} {'-':>7}")
        sp = f"{u['cpu_seconds'] / p['cpu_seconds']:10.1f}x" if u and p else ""
        print(f"{T:>7} | {us} | {ps} | {sp}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dict(config=CONFIG, block_queries=args.block, rows=rows), indent=2))
    tmp.replace(out)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
