"""What the context ablation could show on a Markov background: a reader of the right form's loss per L.

    python benchmarks/ablation_ceiling.py [--windows 12] [--out benchmarks/results/ablation_ceiling.json]

For each background kind of `genome/markov.py` (a table of its own per isochore), draws `--windows`
chains of `--window` bases, each from a fresh table, and scores the last `--targets` bases of each
the way `eval --context` does: target t given bases [t0 - L, t). The reader knows the table's form
and prior but not the table:

- "dirichlet" K, alpha: the Bayes-optimal predictive (Dirichlet posterior mean of the row of the K
  bases before t, counted over the context and the targets before t);
- "additive" K, scale: the MAP logistic regression of the next base on the one-hot K preceding bases
  (Gaussian prior of the table's scale), fitted once to the L context bases.

The gap between two L is what a model that reads that far back could gain on such a background; the
true table's loss (`true`) is the floor. Writes JSON and prints a table (nats per base).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from genome_lm.genome.markov import additive_rows, dirichlet_rows, markov_bases  # noqa: E402

KINDS = [("dirichlet", 1, 0.5), ("dirichlet", 2, 0.5), ("dirichlet", 3, 0.5), ("additive", 6, 0.4)]


def contexts(seq: np.ndarray, order: int) -> np.ndarray:
    """int64 [n]: row index of the `order` bases before each position (base at t - 1 in the lowest bits); -1
    for the first `order`."""
    c = np.zeros(len(seq), dtype=np.int64)
    for i in range(order):
        c[order:] |= seq[order - 1 - i:len(seq) - 1 - i].astype(np.int64) << (2 * i)
    c[:order] = -1
    return c


def dirichlet_reader(seq, order, alpha, t0, lengths) -> list[float]:
    ctx = contexts(seq, order)
    out = []
    for L in lengths:
        counts = np.full((4**order, 4), alpha)
        lo = max(order, t0 - L)
        np.add.at(counts, (ctx[lo:t0], seq[lo:t0]), 1.0)
        nll = 0.0
        for t in range(t0, len(seq)):
            row = counts[ctx[t]]
            nll -= np.log(row[seq[t]] / row.sum())
            row[seq[t]] += 1.0
        out.append(nll / (len(seq) - t0))
    return out


def one_hot(seq: np.ndarray, order: int, positions: np.ndarray) -> torch.Tensor:
    x = np.zeros((len(positions), order * 4))
    for i in range(order):
        x[np.arange(len(positions)), 4 * i + seq[positions - 1 - i]] = 1.0
    return torch.from_numpy(x)


def additive_reader(seq, order, scale, t0, lengths) -> list[float]:
    targets = np.arange(t0, len(seq))
    xt, yt = one_hot(seq, order, targets), torch.from_numpy(seq[targets].astype(np.int64))
    out = []
    for L in lengths:
        pos = np.arange(max(order, t0 - L), t0)
        x, y = one_hot(seq, order, pos), torch.from_numpy(seq[pos].astype(np.int64))
        w = torch.zeros(order * 4, 4, dtype=torch.float64, requires_grad=True)
        b = torch.zeros(4, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(x @ w + b, y, reduction="sum") + (w**2).sum() / (2 * scale**2)
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            out.append(torch.nn.functional.cross_entropy(xt @ w + b, yt).item())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--targets", type=int, default=1024)
    ap.add_argument("--context", default="256,1024,2048,4096,7168")
    ap.add_argument("--out", default="benchmarks/results/ablation_ceiling.json")
    args = ap.parse_args()
    lengths = [int(v) for v in args.context.split(",")]
    t0 = args.window - args.targets
    if max(lengths) > t0:
        ap.error(f"--context {max(lengths)}: more than --window - --targets = {t0}")
    rows = []
    for kind, order, param in KINDS:
        rng = np.random.default_rng(0)
        table = (lambda r: dirichlet_rows(r, order, param)) if kind == "dirichlet" else \
            (lambda r: additive_rows(r, order, param))
        reader = dirichlet_reader if kind == "dirichlet" else additive_reader
        per, true = [], []
        for _ in range(args.windows):
            p = table(rng)
            seq = markov_bases(rng, np.array([args.window + 1.0]), order, args.window, lambda _r, p=p: p).astype(int)
            ctx = contexts(seq, order)[t0:]
            true.append(float(-np.log(p[ctx, seq[t0:]]).mean()))
            per.append(reader(seq, order, param, t0, lengths))
        per = np.asarray(per)  # [windows, n_L]
        span = per[:, lengths.index(1024) if 1024 in lengths else 0] - per[:, -1]  # from 1k (or the shortest)
        rows.append({"kind": kind, "order": order, "param": param, "true": float(np.mean(true)),
                     "by_length": {str(L): float(per[:, j].mean()) for j, L in enumerate(lengths)},
                     "gain_1k_to_longest": float(span.mean()),
                     "gain_sd_over_windows": float(span.std(ddof=1)) if len(span) > 1 else None})
    result = {"windows": args.windows, "window": args.window, "targets": args.targets, "lengths": lengths,
              "units": "nats per base", "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"{'background':<22} {'true':>7} " + " ".join(f"{'L=' + str(L):>8}" for L in lengths) + "   1k->max [sd]")
    for r in rows:
        name = f"{r['kind']} K={r['order']} {'alpha' if r['kind'] == 'dirichlet' else 'scale'} {r['param']}"
        print(f"{name:<22} {r['true']:>7.4f} " + " ".join(f"{v:>8.4f}" for v in r["by_length"].values())
              + f"   {r['gain_1k_to_longest']:+.4f} [{r['gain_sd_over_windows'] or 0:.4f}]")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
