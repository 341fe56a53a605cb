"""Peak memory of streaming scoring by region length, measured against the planner (`plan --score`).

A two-layer model at GLM-5.3-Flash widths (one KDA+MoE and one DSA+MoE layer with its own
indexer: hidden 4096, 64 KDA heads x 128, MLA and indexer as the real model; routed experts cut to
`--experts`, vocabulary 16; bf16 with upstream's float32 exceptions) walks a region of T tokens
in chunks of `--chunk` through `model/streaming.py`'s `StreamingScorer`. It runs on fake tensors
(shapes without data, as `rehearse` does: a 256k region at real width in seconds, on a machine
that could not hold its activations), with the fla call contract and an assumed even routing.

- measured: the peak of the bytes of every tensor storage made during the scoring (`LiveBytes`,
  a dispatch mode; the parameters and the input ids excluded), and the carried state
  `StreamingScorer.cache_bytes()` at the end;
- planned: `plan.memory.plan_score` of the same model shape, peak minus weights, and its
  carried terms (`carried_bytes`);
- slope: bytes per token between the shortest and the longest region, measured and planned.

    python benchmarks/bench_score_memory.py                          # T = 16k .. 256k, chunk 4096
    python benchmarks/bench_score_memory.py --T 16k 32k --chunk 2048

Writes benchmarks/results/score_memory.json and prints a table. Not a test (tests/plan/
test_score_plan.py holds the bound on smaller regions).
"""

from __future__ import annotations

import argparse
import sys
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from genome_lm.outputs import write_json_atomic
from genome_lm.sizes import parse_size

RESULTS = Path(__file__).resolve().parent / "results" / "score_memory.json"
KDA, DSA = "linear_attention", "indexed_attention"


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages made by ops inside the mode and still alive: `.now`, `.peak`.
    Storages alive on entry (`known`: parameters, inputs) are not counted, nor are their views."""

    def __init__(self, known=()):
        super().__init__()
        self.now = self.peak = 0
        self.seen = {t.untyped_storage()._cdata for t in known}

    def _free(self, key: int, n: int) -> None:
        self.seen.discard(key)
        self.now -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and (st := t.untyped_storage())._cdata not in self.seen:
                n = st.nbytes()
                self.seen.add(st._cdata)
                self.now += n
                self.peak = max(self.peak, self.now)
                weakref.finalize(st, self._free, st._cdata, n)
        return out


def real_width_model(experts: int, layer_types=(KDA, DSA)):
    """Glm53-flash widths, one layer per entry of `layer_types` (MoE each, own indexer), on the meta device."""
    from genome_lm.model import build

    n = len(layer_types)
    return build("glm53-flash", dtype=torch.bfloat16, meta=True, num_hidden_layers=n, layer_types=list(layer_types),
                 mlp_layer_types=["sparse"] * n, indexer_types=["full"] * n, n_routed_experts=experts,
                 num_experts_per_tok=min(8, experts), vocab_size=16).model


def measure(model, T: int, chunk: int, fake: bool) -> dict:
    """Stream T random tokens through `model` (long-context classes installed here) in chunks: the
    measured peak and carried bytes, and the planner's for the same shape (peak minus weights)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from genome_lm.model import apply_long_context
    from genome_lm.model.patch import use_fake_values
    from genome_lm.model.streaming import StreamingScorer
    from genome_lm.plan.memory import plan_score
    from genome_lm.plan.shapes import shape_of

    dtype = "bfloat16" if next(model.parameters()).dtype == torch.bfloat16 else "float32"
    shape = shape_of(model, "measured", dtype)
    with FakeTensorMode(allow_non_fake_inputs=True) if fake else torch.no_grad():
        if fake:
            model.to_empty(device="cpu")
            use_fake_values(apply_long_context(model))
        ids = torch.randint(0, model.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
        scorer = StreamingScorer(model, total_len=T)
        t0 = time.perf_counter()
        with LiveBytes([*model.parameters(), *model.buffers(), ids]) as live:
            for t in range(0, T, chunk):
                scorer.step(ids[:, t:t + chunk])
        seconds = time.perf_counter() - t0
        cache = scorer.cache_bytes()
    plan = plan_score(shape, T, chunk, backend="fla" if fake else "torch")
    return {"T": T, "chunk": chunk, "fake": fake, "measured_peak": live.peak, "seconds": seconds,
            "measured_kda_state": cache["kda"], "measured_dsa_caches": cache["dsa"],
            "planned_peak": plan.peak_bytes - plan.breakdown["weights"], "planned_where": plan.peak_where,
            "planned_kda_state": plan.breakdown["kda_state"], "planned_dsa_caches": plan.breakdown["dsa_caches"]}


def slope(rows: list[dict], key: str) -> float:
    a, b = rows[0], rows[-1]
    return (b[key] - a[key]) / (b["T"] - a["T"]) if b["T"] > a["T"] else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", nargs="+", default=["16k", "32k", "64k", "128k", "256k"])
    p.add_argument("--chunk", default="4096")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    torch.set_num_threads(1)
    chunk = parse_size(args.chunk, "--chunk")
    rows = []
    for T in sorted(parse_size(t, "--T") for t in args.T):
        rows.append(measure(real_width_model(args.experts), T, chunk, fake=True))
        print(f"T={T:,}: measured {rows[-1]['measured_peak'] / 2**30:.2f} GiB in {rows[-1]['seconds']:.0f} s",
              flush=True)
    slopes = {k: slope(rows, k) for k in ("measured_peak", "planned_peak", "measured_dsa_caches",
                                          "planned_dsa_caches")}
    out = {"config": {"chunk": chunk, "experts": args.experts, "layers": "kda+moe, dsa+moe (glm53-flash widths)",
                      "tensors": "fake"}, "results": rows, "bytes_per_token": slopes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, out)
    print(f"{'T':>8}{'measured GiB':>14}{'planned GiB':>13}{'planned/meas':>14}{'DSA cache MiB':>15}"
          f"{'planned MiB':>13}{'KDA state MiB':>15}")
    for r in rows:
        print(f"{r['T']:>8,}{r['measured_peak'] / 2**30:>14.3f}{r['planned_peak'] / 2**30:>13.3f}"
              f"{r['planned_peak'] / r['measured_peak']:>14.4f}{r['measured_dsa_caches'] / 2**20:>15.1f}"
              f"{r['planned_dsa_caches'] / 2**20:>13.1f}{r['measured_kda_state'] / 2**20:>15.2f}")
    print("bytes per token (shortest to longest): " + ", ".join(f"{k} {v:,.0f}" for k, v in slopes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
