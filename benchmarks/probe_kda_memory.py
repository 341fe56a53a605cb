"""How far back can a model's KDA layers remember? Their forget gates and write strengths on real tokens.

    python benchmarks/probe_kda_memory.py SHARDS CHECKPOINT [CHECKPOINT ...] [--tokens 4096] [--out FILE.json]

Runs each checkpoint (a `genome-lm train` checkpoint directory, or its `model/` Hugging Face
directory) over the first `--tokens` tokens of the first eval window of SHARDS and records, per
KDA (linear-attention) layer:

- the forget gate's log decay per key channel, g [T, H, D] (alpha = exp(g) is the fraction of that
  channel of the state kept per token); each channel's *horizon* is 1 / mean(-g), the number of
  tokens after which it keeps 1/e of what it held;
- the delta rule's write strength per head, beta [T, H]: a key seen again has the value stored
  under it replaced at rate beta, so beta ~ 0.2 remembers about the last 5 writes per key.

Prints the horizon quantiles over the layer's H * D channels and beta's mean per head; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from genome_lm.genome import load_shards
from genome_lm.model import build
from genome_lm.train.checkpoint import resolve_model_dir

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def probe(checkpoint: Path, tokens: np.ndarray) -> dict:
    model = build(str(resolve_model_dir(checkpoint)), dtype="float32").model.eval()
    seen: dict[str, dict] = {}
    hooks = []
    for name, module in model.named_modules():
        if hasattr(module, "forget_gate") and hasattr(module, "b_proj"):  # a KDA layer (upstream's names)
            layer = seen.setdefault(name, {})
            hooks.append(module.forget_gate.register_forward_hook(
                lambda _m, _i, out, layer=layer: layer.__setitem__("g", out.detach().float())))
            hooks.append(module.b_proj.register_forward_hook(
                lambda _m, _i, out, layer=layer: layer.__setitem__("beta", torch.sigmoid(out.detach().float()))))
    with torch.no_grad():
        model(torch.from_numpy(tokens.astype(np.int64))[None])
    for h in hooks:
        h.remove()
    out = {}
    for name, layer in seen.items():
        horizon = (1.0 / (-layer["g"][0]).mean(0)).flatten()  # [H * D]
        q = torch.quantile(horizon, torch.tensor(QUANTILES, dtype=horizon.dtype))
        out[name] = {"horizon_quantiles": {str(k): float(v) for k, v in zip(QUANTILES, q)},
                     "beta_mean_per_head": [float(b) for b in layer["beta"][0].mean(0)]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shards", type=Path)
    ap.add_argument("checkpoints", type=Path, nargs="+")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/probe_kda_memory.json"))
    args = ap.parse_args()
    tokens = load_shards(args.shards, "eval")[0]["tokens"][:args.tokens]
    result = {"shards": str(args.shards), "tokens": len(tokens), "quantiles": list(QUANTILES),
              "checkpoints": {str(c): probe(c, tokens) for c in args.checkpoints}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{'checkpoint':<44} {'layer':<24} horizon (tokens) at quantiles "
          f"{', '.join(map(str, QUANTILES))}; beta per head")
    for c, layers in result["checkpoints"].items():
        for name, r in layers.items():
            h = " ".join(f"{v:>8.1f}" for v in r["horizon_quantiles"].values())
            b = ", ".join(f"{v:.3f}" for v in r["beta_mean_per_head"])
            print(f"{c[-44:]:<44} {name[-24:]:<24} {h}; {b}")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
