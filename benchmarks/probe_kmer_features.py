"""Does a model's residual stream carry the preceding bases? Linear probes per layer and offset.

    python benchmarks/probe_kmer_features.py CHECKPOINT [CHECKPOINT ...] [--offsets 10] [--out FILE.json]

An attention can copy by content (an induction head) only if its keys and queries can encode the
k-mer before each position, so the residual stream entering a DSA layer must carry the bases at
offsets -1, -2, ... linearly enough for a projection to read them. For each checkpoint (a
`genome-lm train` checkpoint directory, its `model/` Hugging Face directory, or a preset name) this
runs 32 random sequences of 128 bases, takes the residual stream after the embedding and after each
decoder layer (all `hc_mult` streams concatenated), and fits one multinomial logistic regression per
offset i = 0 .. OFFSETS-1 that predicts the base i positions back (features standardised, fitted on
3/4 of the positions, accuracy on the rest; chance is 0.25). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from genome_lm.model import apply_long_context, build
from genome_lm.model.presets import PRESETS
from genome_lm.train.checkpoint import resolve_model_dir

BATCH, SEQ, SKIP = 32, 128, 16  # random sequences, their length, and the first positions left out


def residual_streams(model, x: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """[(name, [B, T, F])]: the embedding's output, then each decoder layer's (hc streams flattened)."""
    taps: list[tuple[str, torch.Tensor]] = []
    hooks = []
    for name, module in model.named_modules():
        if name.endswith("embed_tokens"):
            hooks.append(module.register_forward_hook(lambda _m, _i, out: taps.append(("embedding", out))))
        elif name.endswith("layers"):
            for i, layer in enumerate(module):
                kind = "KDA" if hasattr(layer.self_attn, "forget_gate") else "DSA"
                hooks.append(layer.register_forward_hook(
                    lambda _m, _i, out, tag=f"layer {i} ({kind})": taps.append(
                        (tag, out[0] if isinstance(out, tuple) else out))))
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return [(name, h.reshape(h.shape[0], h.shape[1], -1).float()) for name, h in taps]


def probe_accuracy(features: torch.Tensor, x: torch.Tensor, offset: int) -> float:
    """Held-out accuracy of a linear read-out of x[t - offset] from features [B, T, F] at t >= SKIP."""
    f = features[:, SKIP:].reshape(-1, features.shape[-1])
    y = x[:, SKIP - offset:x.shape[1] - offset].reshape(-1)
    n = f.shape[0] * 3 // 4
    f = (f - f[:n].mean(0)) / (f[:n].std(0) + 1e-6)
    w = torch.zeros(f.shape[1], 4, requires_grad=True)
    b = torch.zeros(4, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(f[:n] @ w + b, y[:n]) + 1e-4 * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(((f[n:] @ w + b).argmax(1) == y[n:]).float().mean())


def probe(checkpoint: str, offsets: int) -> dict[str, list[float]]:
    source = checkpoint if checkpoint in PRESETS else str(resolve_model_dir(checkpoint))
    torch.manual_seed(0)
    model = apply_long_context(build(source, dtype="float32").model).eval()
    x = torch.randint(0, 4, (BATCH, SEQ))
    return {name: [probe_accuracy(h, x, i) for i in range(offsets)] for name, h in residual_streams(model, x)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--offsets", type=int, default=10, help="probe the bases 0 .. OFFSETS-1 positions back")
    ap.add_argument("--out", default="benchmarks/results/probe_kmer_features.json")
    args = ap.parse_args()
    if not 0 < args.offsets <= SKIP:
        sys.exit(f"--offsets must be in 1..{SKIP}")
    results = {}
    for ckpt in args.checkpoints:
        results[ckpt] = probe(ckpt, args.offsets)
        print(f"\n{ckpt}\n{'residual stream after':<22} " + " ".join(f"{-i:>5}" for i in range(args.offsets)))
        for name, accs in results[ckpt].items():
            print(f"{name:<22} " + " ".join(f"{a:>5.2f}" for a in accs))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "accuracy": results}, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
