"""Does a model learn in-context copying (induction) within a budget? The demo's open question.

Task: B sequences of T bases, the second half an exact copy of the first (random bases). Only the
copied half can be predicted below ln 4 = 1.386 nats, and only by looking back T/2 tokens. Prints
the loss on the copied half every `--every` steps and writes JSON.

    python benchmarks/probe_copy_learning.py --steps 800 --lr 2e-3 [--set index_topk=256 ...]

Measured on 2 CPU cores: glm53-tiny with dense DSA (index_topk=256) stays at 1.386 for 3000 steps
(lr 2e-3); lr 5e-3 and 4 heads / rank-64 MLA also flat for 800 steps. A 2-layer d64 NoPE torch
transformer with a depthwise causal conv learns it at ~700 steps (lr 1e-3).

With B 8 x T 128, 4 letters, lr 2e-3, one thread each, the bottleneck is the k-mer key. Three
layers KDA, DSA, DSA (4 heads) start copying after ~1700 steps with KDA's 4-wide short convolution
and after ~500-700 with an 8-wide one (also with hc_mult 4 and MoE); a 16-wide one does not within
1500. That is the `glm53-demo` preset (docs/findings.md, "Copying in context needs k-mer keys"):

    python benchmarks/probe_copy_learning.py --preset glm53-demo --seq-len 128 --steps 1500 --set

`--save DIR` writes the trained model, which `model.init` takes (docs/findings.md: a demo base started
from a model taught to copy here). `--init DIR` starts from such a model instead of the preset, and
`--score-seq-len T ...` then scores fresh copy batches of each length T (the copy T/2 tokens back)
with full attention and with every DSA layer limited to its last W keys for each
`--attention-window W` (as `probe_context_reach.py`): whether the copy is the attention's, and
whether it holds at distances the model was not trained on. The first half's copy is always
exactly T/2 back, which an attention can find by position; `--random-offset` copies T/4 bases from
a uniformly random earlier start instead, which only a content match (an induction head) finds.

    python benchmarks/probe_copy_learning.py --init DIR --steps 0 --score-seq-len 128 512 2048 \
        --attention-window 16 --set

`--position-test SEQS` then asks where such a copy stops working: a copy late in sequences of twice
`--seq-len`, with the KDA state and the attention restarting at `--seq-len` or not (`position_test`).

`--preset reference` trains a plain 2-layer NoPE transformer instead (`ReferenceCopyModel`: d 64,
4 heads, a width-8 depthwise causal convolution added to the embeddings), the yardstick for what
this task takes at this size (its runs: docs/findings.md, "The attention learns no induction copy").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from genome_lm.model import apply_long_context, build
from genome_lm.model.weights.writer import save_pretrained
from genome_lm.options import apply_override

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_context_reach


class ReferenceCopyModel(nn.Module):
    """A plain 2-layer NoPE transformer over 4 letters (d 64, 4 heads, GELU MLPs, pre-norm) whose
    embeddings get a width-8 depthwise causal convolution added: the previous bases sit in the
    residual stream from the start. Called like the genome_lm model: per_token_nll [B, T] is
    -log p(x[t] | x[:t]) (0 at t = 0), loss its mean over t >= 1."""

    def __init__(self, d: int = 64, heads: int = 4, conv: int = 8, layers: int = 2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(4, d)
        self.conv = nn.Conv1d(d, d, conv, groups=d, padding=conv - 1)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            norm1=nn.LayerNorm(d), qkv=nn.Linear(d, 3 * d), out=nn.Linear(d, d), norm2=nn.LayerNorm(d),
            mlp=nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)))) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor, return_per_token_nll: bool = True):
        B, T = x.shape
        h = self.embed(x)
        h = h + F.silu(self.conv(h.transpose(1, 2))[..., :T].transpose(1, 2))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["norm1"](h)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + blk["out"](attn.transpose(1, 2).reshape(B, T, -1))
            h = h + blk["mlp"](blk["norm2"](h))
        logits = self.head(self.norm(h))[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, 4), labels[:, 1:].reshape(-1), reduction="none").view(B, T - 1)
        return SimpleNamespace(loss=nll.mean(), per_token_nll=F.pad(nll, (1, 0)))


def copy_batch(batch: int, T: int, random_offset: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 [batch, T] random bases with a copy in each row, and bool [batch, T]: the copied bases
    after the copy's first. Fixed: the second half copies the first (T/2 back). Random offset: a
    stretch of T/4 bases is copied from a uniform earlier start, so only a content match finds it."""
    if not random_offset:
        half = torch.randint(0, 4, (batch, T // 2))
        mask = torch.zeros(batch, T, dtype=torch.bool)
        mask[:, T // 2 + 1:] = True
        return torch.cat([half, half], dim=1), mask
    x, m = torch.randint(0, 4, (batch, T)), T // 4
    mask = torch.zeros(batch, T, dtype=torch.bool)
    for b in range(batch):
        dst = int(torch.randint(m, T - m + 1, ()))
        src = int(torch.randint(0, dst - m + 1, ()))
        x[b, dst:dst + m] = x[b, src:src + m]
        mask[b, dst + 1:dst + m] = True
    return x, mask


def score(model, lengths: list[int], windows: list[int], batch: int, random_offset: bool = False) -> list[dict]:
    """Mean NLL of the copied bases (after the copy's first; `copy_batch`) of `batch` fresh copy
    sequences of each length T, with full attention and banded to each of `windows` keys; printed."""
    from probe_context_reach import banded_attention

    torch.manual_seed(1)
    rows = []
    heads = ["full", *(f"last {w}" for w in windows)]
    print(f"\n{'T':>6} {'copy distance':>14} " + " ".join(f"{a:>12}" for a in heads))
    for T in lengths:
        x, mask = copy_batch(batch, T, random_offset)
        nll = {}
        for head, w in zip(heads, [0, *windows]):
            with torch.no_grad(), banded_attention(w) if w else nullcontext():
                out = model(x, labels=x, return_per_token_nll=True)
            nll[head] = float(out.per_token_nll[mask].mean())
        distance = f"{T // 4}-{T - T // 4}" if random_offset else str(T // 2)
        rows.append({"seq_len": T, "copy_distance": distance, "copied_nll": nll})
        print(f"{T:>6} {distance:>14} " + " ".join(f"{v:>12.4f}" for v in nll.values()))
    return rows


def position_test(model, W: int, batch: int) -> dict:
    """Does a copy learnt in sequences of W tokens work later in a longer one, and what must restart
    for it to? `batch` random sequences of 2W bases, each with W/4 bases copied from 3W/8 back ending
    at 2W - 5 (inside the second W tokens); mean NLL of the copied bases after the copy's fourth, with
    the model as it is and with parts of it restarting at token W (`probe_context_reach`'s patches).
    "fresh" scores the second W tokens alone; "KDA and attention restart" must equal it exactly on
    all of them but the first (whose prediction comes from token W - 1): nothing else carries the
    first W tokens forward, which `max_abs_diff` checks. Printed."""
    from probe_context_reach import banded_attention, kda_restart

    torch.manual_seed(2)
    T, m, d = 2 * W, W // 4, 3 * W // 8
    x, mask = torch.randint(0, 4, (batch, T)), torch.zeros(batch, T, dtype=torch.bool)
    dst = T - 5 - m + 1
    x[:, dst:dst + m] = x[:, dst - d:dst - d + m]
    mask[:, dst + 4:dst + m] = True
    fresh, both = f"fresh: the last {W} tokens alone", f"KDA and attention restart at {W}"
    variants = {
        fresh: (x[:, W:], ()),
        f"{T} tokens as they are": (x, ()),
        f"KDA restarts at {W}": (x, (kda_restart(W),)),
        f"attention restarts at {W}": (x, (banded_attention(W, restart=True),)),
        both: (x, (kda_restart(W), banded_attention(W, restart=True))),
        f"attention to the last {W} keys": (x, (banded_attention(W),)),
        f"KDA restarts, attention to the last {W} keys": (x, (kda_restart(W), banded_attention(W))),
    }
    rows, per_token = [], {}
    print(f"\nposition test: {batch} sequences, {m} bases copied from {d} back, ending at {T - 5} of {T}")
    for name, (inp, patches) in variants.items():
        with torch.no_grad(), ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            nll = model(inp, labels=inp, return_per_token_nll=True).per_token_nll
        if name in (fresh, both):
            per_token[name] = nll[:, -W:]
        rows.append({"variant": name, "copied_nll": float(nll[:, -W:][mask[:, W:]].mean())})
        print(f"  {name:<52} {rows[-1]['copied_nll']:.4f}")
    diff = float((per_token[both] - per_token[fresh])[:, 1:].abs().max())
    print(f"  max |restart - fresh| over tokens W+1 ... 2W-1: {diff:.2e}")
    return {"window": W, "sequences": batch, "copy_length": m, "copy_distance": d, "rows": rows,
            "max_abs_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="glm53-tiny", help="a model preset, or `reference` (ReferenceCopyModel)")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--set", nargs="*", default=["index_topk=256"], metavar="FIELD=VALUE",
                    help="config overrides (default: dense DSA)")
    ap.add_argument("--out", default="benchmarks/results/probe_copy_learning.json")
    ap.add_argument("--save", default=None, metavar="DIR",
                    help="also write the trained model there (a Hugging Face directory that `model.init` and "
                         "`genome-lm eval` take); pass `--set` with no values to keep the preset's dense DSA to 8k")
    ap.add_argument("--init", default=None, metavar="DIR", help="start from this saved model, not --preset")
    ap.add_argument("--score-seq-len", type=int, nargs="*", default=[], metavar="T",
                    help="after training, score the copied half of 8 fresh copy sequences of each length T")
    ap.add_argument("--attention-window", type=int, nargs="*", default=[], metavar="W",
                    help="with --score-seq-len: also score with every DSA layer limited to its last W keys")
    ap.add_argument("--position-test", type=int, default=0, metavar="SEQS",
                    help="after training, score a copy late in SEQS sequences of 2 x --seq-len bases, with the "
                         "KDA state and the attention restarting at --seq-len or not (`position_test`)")
    ap.add_argument("--random-offset", action="store_true",
                    help="copy T/4 bases from a random earlier start instead of the first half (a content match)")
    args = ap.parse_args()
    overrides: dict = {}
    for assignment in args.set:  # values parsed as YAML, as `--set` of an experiment (lists too)
        apply_override(overrides, assignment)
    torch.manual_seed(0)
    reference = args.preset == "reference" and not args.init
    if reference and (args.save or args.attention_window or args.position_test
                      or args.set not in ([], ap.get_default("set"))):
        ap.error("--preset reference takes no --save, --attention-window, --position-test or --set "
                 "(it is no genome_lm model)")
    if reference:
        model = ReferenceCopyModel()
    else:
        model = apply_long_context(build(args.init or args.preset, dtype="float32", **overrides).model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    B, T = args.batch, args.seq_len
    rows, t0 = [], time.perf_counter()
    print(f"{'step':>6} {'copied nll':>16} {'s':>8}")
    for step in range(args.steps):
        x, mask = copy_batch(B, T, args.random_offset)
        out = model(x, labels=x, return_per_token_nll=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % args.every == 0 or step == args.steps - 1:
            copied = float(out.per_token_nll.detach()[mask].mean())
            rows.append({"step": step, "copied_half_nll": copied, "elapsed_s": time.perf_counter() - t0})
            print(f"{step:>6} {copied:>16.4f} {rows[-1]['elapsed_s']:>8.1f}", flush=True)
    scores = score(model, args.score_seq_len, args.attention_window, B, args.random_offset) \
        if args.score_seq_len else []
    position = position_test(model.eval(), T, args.position_test) if args.position_test else None
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows, "scores": scores,
                                          "position_test": position}, indent=1))
    print(f"wrote {args.out}")
    if args.save:
        save_pretrained(model, args.save, overwrite=True)
        print(f"saved the model to {args.save}")


if __name__ == "__main__":
    main()
