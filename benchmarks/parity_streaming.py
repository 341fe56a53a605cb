"""Log-prob parity: streaming scorer vs the parallel (training) forward on glm53-tiny.

For each dtype and chunk size: max and mean |Δ log-prob| over all tokens of one random sequence,
the time of each engine (no gradients) and the resident memory a streaming pass adds (VmHWM reset
before it; streaming runs before the parallel pass, so the first chunk size's figure is clean). Our
counterpart of the reference run's comparison of training log-probs against vLLM (0.04-0.07 in bf16).

    python benchmarks/parity_streaming.py                          # T = 8192, fp32 and bf16
    python benchmarks/parity_streaming.py --T 131072 --chunks 4096 --dtypes float32 \
        --out benchmarks/results/parity_streaming_128k.json

Writes benchmarks/results/parity_streaming.json and prints a table. Not a test
(tests/model/test_streaming.py holds the 1e-4 fp32 bound).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from genome_lm.model import apply_long_context, build
from genome_lm.model.streaming import score_streaming

RESULTS = Path(__file__).resolve().parent / "results" / "parity_streaming.json"


def _kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def measure(dtype: str, T: int, chunks: list[int], seed: int) -> list[dict]:
    torch.manual_seed(seed)
    model = apply_long_context(build("glm53-tiny", dtype=dtype).model).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(seed))
    streamed = []
    for chunk in chunks:  # streaming first: its memory is measured before the parallel pass runs
        rss = _kb("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        got = score_streaming(model, ids, chunk)
        streamed.append((chunk, got, time.perf_counter() - t0, (_kb("VmHWM") - rss) / 1024))
    t0 = time.perf_counter()
    with torch.no_grad():
        ref = model(ids, return_per_token_nll=True).per_token_nll[0]
    t_par = time.perf_counter() - t0
    rows = []
    for chunk, got, t_str, peak_mib in streamed:
        d = (got - ref).abs()
        rows.append({"dtype": dtype, "T": T, "chunk_tokens": chunk, "max_abs_dlogprob": d.max().item(),
                     "mean_abs_dlogprob": d.mean().item(), "parallel_s": t_par, "streaming_s": t_str,
                     "streaming_peak_mib": peak_mib, "mean_nll": ref[1:].mean().item()})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, default=8192)
    p.add_argument("--chunks", type=int, nargs="+", default=[512, 3000, 8192])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [r for dtype in args.dtypes for r in measure(dtype, args.T, args.chunks, args.seed)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()}, "results": rows}, indent=2))
    tmp.replace(args.out)
    print(f"{'dtype':<10}{'T':>7}{'chunk':>7}{'max|Δ|':>10}{'mean|Δ|':>10}"
          f"{'parallel s':>11}{'stream s':>10}{'stream MiB':>11}")
    for r in rows:
        print(f"{r['dtype']:<10}{r['T']:>7}{r['chunk_tokens']:>7}{r['max_abs_dlogprob']:>10.2e}"
              f"{r['mean_abs_dlogprob']:>10.2e}{r['parallel_s']:>11.2f}{r['streaming_s']:>10.2f}"
              f"{r['streaming_peak_mib']:>11.0f}")


if __name__ == "__main__":
    main()
