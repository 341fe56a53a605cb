"""What the context ablation could show on a Markov background: a reader of the right form's loss per L.

    python benchmarks/ablation_ceiling.py [--windows 12] [--out benchmarks/results/ablation_ceiling.json]

For each background kind of `genome/synth.py` (a table of its own per isochore), draws `--windows`
chains of `--window` bases, each from a fresh table, and scores the last `--targets` bases of each
the way `eval --context` does: target t given bases [t0 - L, t). The reader knows the table's form
and prior but not the table:

- "dirichlet" K, alpha: the Bayes-optimal predictive (Dirichlet posterior mean of the row of the K
  bases before t, counted over the context and the targets before t);
- "additive" K, scale: the MAP logistic regression of the next base on the one-hot K preceding bases
  (Gaussian prior of the table's scale), fitted once to the L context bases.

`--delta-heads` adds what KDA heads could read: each a delta rule with no decay and a fixed write
strength beta (least-mean-squares regression with a fixed step), keys the preceding bases as the
table reads them (additive: the K one-hot bases, unit norm; dirichlet: the one-hot K-mer), values the
one-hot next base, state from zero at t0 - L and written through the targets too. Each head's output
S k_t is normalised to unit length, as KDA's gated norm does; a set of heads ("0.1,0.01": a fast and a
slow one) is read out together by one linear map and softmax, fitted on `--windows` other windows over
all L at once (a model reads its state with the same weights whatever the context).

`--shards DIR` also scores the delta-rule readers on a prepared genome's own windows (`--split`, those
`--window` long without N; readout fitted on the odd windows, scored on the even ones), keys of the
`--shards-order` preceding bases: what such a reader gains on that genome, repeats and all.

    python benchmarks/ablation_ceiling.py --shards shards/demo   # after `make demo`

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
import torch.nn.functional as F

from genome_lm.genome.synth import additive_rows, dirichlet_rows, markov_bases

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


def length_summary(per: np.ndarray, lengths: list[int]) -> dict:
    """per [windows, n_L] loss -> the mean loss per L, and the per-window loss at 1k (or the shortest L) minus
    at the longest L: its mean, sd over windows and 95% percentile-bootstrap CI over windows (4,000 resamples)."""
    span = per[:, lengths.index(1024) if 1024 in lengths else 0] - per[:, -1]
    idx = np.random.default_rng(0).integers(0, len(span), (4000, len(span)))
    low, high = np.quantile(span[idx].mean(1), [0.025, 0.975])
    return {"by_length": {str(L): float(per[:, j].mean()) for j, L in enumerate(lengths)},
            "gain_1k_to_longest": float(span.mean()),
            "gain_sd_over_windows": float(span.std(ddof=1)) if len(span) > 1 else None,
            "gain_ci95": [float(low), float(high)]}


def delta_keys(seq: np.ndarray, kind: str, order: int) -> np.ndarray:
    """float64 [n, d] unit keys of the bases before each position as `kind`'s table reads them; zero for the
    first `order` positions."""
    n = len(seq)
    if kind == "dirichlet":
        k = np.zeros((n, 4**order))
        k[np.arange(order, n), contexts(seq, order)[order:]] = 1.0
        return k
    k = np.zeros((n, 4 * order))
    for i in range(order):
        k[np.arange(order, n), 4 * i + seq[order - 1 - i:n - 1 - i]] = 1.0
    return k / np.sqrt(order)


def delta_outputs(seqs: np.ndarray, kind: str, order: int, betas: list[float], t0: int,
                  lengths: list[int]) -> np.ndarray:
    """float64 [n_beta, n_L, N, targets, 4]: a delta-rule head's unit-length output at each target of each of
    the N windows `seqs` [N, window], per beta and per L (state from zero at t0 - L, no decay)."""
    keys = np.stack([delta_keys(s, kind, order) for s in seqs])  # [N, window, d]
    values = np.eye(4)[seqs]  # [N, window, 4]
    beta = np.asarray(betas)[:, None, None, None]
    out = np.zeros((len(betas), len(lengths), len(seqs), seqs.shape[1] - t0, 4))
    for j, L in enumerate(lengths):
        S = np.zeros((len(betas), len(seqs), 4, keys.shape[-1]))  # [n_beta, N, 4, d]
        for t in range(max(order, t0 - L), seqs.shape[1]):
            k = keys[:, t]
            sk = np.einsum("bnvd,nd->bnv", S, k)
            if t >= t0:
                out[:, j, :, t - t0] = sk
            S += beta * np.einsum("bnv,nd->bnvd", values[None, :, t] - sk, k)
    return out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)


def readout_nll(o: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """o [n_heads, n_L, N, targets, 4] unit outputs, y [N, targets] bases, w [n_heads, 4, 4], b [4] -> NLL
    [n_L, N, targets] of softmax(sum over heads of o_h @ w_h + b)."""
    z = torch.einsum("hlntv,hvw->lntw", o, w) + b
    return F.cross_entropy(z.reshape(-1, 4), y.expand(z.shape[0], -1, -1).reshape(-1),
                           reduction="none").reshape(z.shape[:3])


def fit_readout(o: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The linear readout (w, b) of `readout_nll` that minimises the mean NLL over every L at once: one
    model reads its state with the same weights whatever the context."""
    w = torch.zeros(o.shape[0], 4, 4, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = readout_nll(o, y, w, b).mean()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def delta_rows(fit: np.ndarray, test: np.ndarray, kind: str, order: int, heads: list[tuple[float, ...]],
               t0: int, lengths: list[int], **labels) -> list[dict]:
    """One row per entry of `heads` (the betas of the delta-rule heads read together): the loss per L on the
    windows `test` [N, window], with the readout fitted on the windows `fit`."""
    betas = sorted({beta for h in heads for beta in h}, reverse=True)
    o_fit, o_test = (torch.from_numpy(delta_outputs(s, kind, order, betas, t0, lengths)) for s in (fit, test))
    y_fit, y_test = (torch.from_numpy(s[:, t0:].astype(np.int64)) for s in (fit, test))
    rows = []
    for h in heads:
        idx = [betas.index(beta) for beta in h]
        w, b = fit_readout(o_fit[idx], y_fit)
        with torch.no_grad():
            per = readout_nll(o_test[idx], y_test, w, b).mean(-1).T.numpy()  # [windows, n_L]
        rows.append({**labels, "kind": kind, "order": order, "reader": "delta", "betas": list(h),
                     **length_summary(per, lengths)})
    return rows


def chains(kind: str, order: int, param: float, n: int, window: int, seed: int):
    """`n` pure chains of `window` bases of background `kind`, each from a fresh table -> (int [n, window], the
    tables)."""
    rng = np.random.default_rng(seed)
    seqs, tables = [], []
    for _ in range(n):
        p = dirichlet_rows(rng, order, param) if kind == "dirichlet" else additive_rows(rng, order, param)
        seqs.append(markov_bases(rng, np.array([window + 1.0]), order, window, lambda _r, p=p: p).astype(int))
        tables.append(p)
    return np.stack(seqs), tables


def shard_windows(directory: str, split: str, window: int) -> np.ndarray:
    """int [N, window]: the base codes of every window of a prepared split that is `window` long and has no N."""
    from genome_lm.genome.shards import load_shards

    ds = load_shards(directory, split)
    rows = [np.asarray(r, dtype=np.int64) for r in ds["tokens"]]
    return np.stack([r for r in rows if len(r) == window and r.max() < 4])


def parse_heads(text: str) -> list[tuple[float, ...]]:
    return [tuple(float(v) for v in h.split(",")) for h in text.split(";") if h]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--targets", type=int, default=1024)
    ap.add_argument("--context", default="256,1024,2048,4096,7168")
    ap.add_argument("--delta-heads", default="0.3;0.1;0.03;0.01;0.003;0.1,0.01",
                    help="delta-rule readers: ';'-separated sets of write strengths read together ('' for none)")
    ap.add_argument("--shards", help="also score the delta-rule readers on this prepared genome's windows")
    ap.add_argument("--split", default="eval")
    ap.add_argument("--shards-order", type=int, default=6, help="preceding bases in the readers' keys on --shards")
    ap.add_argument("--out", default="benchmarks/results/ablation_ceiling.json")
    args = ap.parse_args()
    lengths = [int(v) for v in args.context.split(",")]
    heads = parse_heads(args.delta_heads)
    t0 = args.window - args.targets
    if max(lengths) > t0:
        ap.error(f"--context {max(lengths)}: more than --window - --targets = {t0}")
    rows = []
    for kind, order, param in KINDS:
        name = f"{kind} K={order} {'alpha' if kind == 'dirichlet' else 'scale'} {param}"
        test, tables = chains(kind, order, param, args.windows, args.window, seed=0)
        reader = dirichlet_reader if kind == "dirichlet" else additive_reader
        per = np.asarray([reader(seq, order, param, t0, lengths) for seq in test])  # [windows, n_L]
        true = [float(-np.log(p[contexts(seq, order)[t0:], seq[t0:]]).mean()) for seq, p in zip(test, tables)]
        rows.append({"background": name, "kind": kind, "order": order, "param": param, "reader": "bayes",
                     "true": float(np.mean(true)), **length_summary(per, lengths)})
        if heads:
            fit, _ = chains(kind, order, param, args.windows, args.window, seed=1)
            rows += delta_rows(fit, test, kind, order, heads, t0, lengths, background=name, param=param)
    if args.shards and heads:
        seqs = shard_windows(args.shards, args.split, args.window)
        name = f"{args.shards} ({args.split}, {len(seqs[0::2])} windows)"
        rows += delta_rows(seqs[1::2], seqs[0::2], "additive", args.shards_order, heads, t0, lengths, background=name)
    result = {"windows": args.windows, "window": args.window, "targets": args.targets, "lengths": lengths,
              "shards": args.shards, "units": "nats per base", "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    width = max(len(r["background"]) for r in rows)
    print(f"{'background':<{width}} {'reader':<14} {'true':>7} " + " ".join(f"{'L=' + str(L):>8}" for L in lengths)
          + "   1k->max [95% CI over windows]")
    for r in rows:
        reader = "bayes" if r["reader"] == "bayes" else "delta " + "+".join(f"{b:g}" for b in r["betas"])
        true = f"{r['true']:>7.4f}" if "true" in r else f"{'':>7}"
        by_length = " ".join(f"{v:>8.4f}" for v in r["by_length"].values())
        print(f"{r['background']:<{width}} {reader:<14} {true} {by_length}"
              f"   {r['gain_1k_to_longest']:+.4f} [{r['gain_ci95'][0]:+.4f}, {r['gain_ci95'][1]:+.4f}]")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
