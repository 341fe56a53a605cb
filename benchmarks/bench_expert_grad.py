"""The backward of expert parallelism's per-expert matmuls: `expert_linear` against autograd through
`weight[e]` (upstream's eager loop), side by side.

One process on CPU, float32. A rank's local experts [El, O, I] and R rows grouped by expert, as
`model/ops/moe/ep.py` runs them for one MoE block. Autograd through `weight[e]` gives every expert
a zero-filled [El, O, I] gradient and adds them (El weight-sized tensors and El - 1 sums per block);
`expert_linear` writes each expert's gradient into one [El, O, I] tensor. Reported per variant: the
median backward time, the weight-sized tensors the backward makes, and the bytes they hold; the
gradients are checked equal bit for bit. GLM-5.3-Flash at ep 8 has El = 36 and O x I = 4096 x 4096
(gate_up) per expert; the default here keeps El and scales O, I and the rows down to fit a CPU.

Writes benchmarks/results/bench_expert_grad.json and prints a table.

    python benchmarks/bench_expert_grad.py [--experts 36] [--out-dim 512] [--in-dim 512] [--rows 128] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from genome_lm.model.ops.moe.ep import expert_linear

HERE = Path(__file__).resolve().parent


class WeightSized(TorchDispatchMode):
    """Counts the tensors of the weight's size that ops create."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.made = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += isinstance(out, torch.Tensor) and out.numel() == self.numel
        return out


def per_expert(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    return torch.cat([F.linear(part, w[e]) for e, part in enumerate(torch.split(x, counts))])


def backward_s(fn, x, w, counts, g) -> tuple[float, torch.Tensor]:
    out = fn(x, w, counts)
    start = time.perf_counter()
    (gw,) = torch.autograd.grad(out, (w,), g)
    return time.perf_counter() - start, gw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experts", type=int, default=36)
    ap.add_argument("--out-dim", type=int, default=512)
    ap.add_argument("--in-dim", type=int, default=512)
    ap.add_argument("--rows", type=int, default=128, help="rows per expert")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=str(HERE / "results" / "bench_expert_grad.json"))
    args = ap.parse_args()

    torch.manual_seed(0)
    counts = [args.rows] * args.experts
    w = torch.randn(args.experts, args.out_dim, args.in_dim, requires_grad=True)
    x = torch.randn(sum(counts), args.in_dim)
    g = torch.randn(sum(counts), args.out_dim)
    variants = {"autograd through weight[e]": per_expert, "expert_linear": expert_linear}
    times: dict[str, list[float]] = {name: [] for name in variants}
    grads = {}
    for _ in range(args.repeats + 1):  # the first round warms up, not counted
        for name, fn in variants.items():
            s, grads[name] = backward_s(fn, x, w, counts, g)
            times[name].append(s)
    assert torch.equal(*grads.values()), "the two weight gradients differ"
    rows = []
    for name, fn in variants.items():
        with WeightSized(w.numel()) as mode:
            backward_s(fn, x, w, counts, g)
        rows.append({"variant": name, "backward_s": statistics.median(times[name][1:]),
                     "weight_sized_tensors": mode.made, "weight_sized_bytes": mode.made * w.numel() * w.element_size()})
    ratio = rows[0]["backward_s"] / rows[1]["backward_s"]
    result = {"experts": args.experts, "out_dim": args.out_dim, "in_dim": args.in_dim, "rows_per_expert": args.rows,
              "repeats": args.repeats, "threads": torch.get_num_threads(), "rows": rows,
              "speedup": ratio, "gradients_equal": True}
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"El={args.experts} experts of [{args.out_dim}, {args.in_dim}], {args.rows} rows each, float32, "
          f"median of {args.repeats}")
    print(f"{'variant':30s} {'backward s':>11s} {'weight-sized tensors':>21s} {'their MiB':>10s}")
    for r in rows:
        print(f"{r['variant']:30s} {r['backward_s']:11.4f} {r['weight_sized_tensors']:21d} "
              f"{r['weight_sized_bytes'] / 2**20:10.1f}")
    print(f"expert_linear backward: {ratio:.1f}x faster; weight gradients equal bit for bit -> {args.json}")


if __name__ == "__main__":
    main()
