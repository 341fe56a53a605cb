"""Which part of a model makes its context ablation move: the DSA attention or the KDA state?

Runs `genome-lm eval --context` (forward strand) on one checkpoint as trained and once per
variant, and prints the ablations side by side (mean NLL per L, and the paired change from the
shortest L to the longest with its window-bootstrap 95% CI, as summary.json's `span`):

- `--attention-window W ...`: every DSA layer attends to the last W keys only (a banded causal
  mask on the dense path), so whatever the model takes from more than W tokens back comes
  through the KDA state. Needs dense DSA over the scored lengths (glm53-demo: top-k 8192).
- `--kda-time-scale C ...`: every KDA layer's write strength beta and forget-gate log decay g are
  divided by C, which slows the delta rule's dynamics C times: the same fixed point, reached
  over C times as many tokens (the KDA analogue of interpolating RoPE positions before a
  long-context fine-tune). With `--finetune-steps N` the scaled model is first fine-tuned as
  `experiments/demo_longctx.yaml` (from the checkpoint, at the shards' window length) for N steps,
  under the same scale, and that model is evaluated as a further variant.

    python benchmarks/probe_context_reach.py CHECKPOINT SHARDS [--attention-window 256 1024]
        [--kda-time-scale 8] [--finetune-steps 100] [--out FILE.json]

`probe_copy_learning.py --position-test` also uses `banded_attention(W, restart=True)` (each
query sees only its own W-block's keys) and `kda_restart(W)` (every KDA layer starts afresh at each
W-block).

Both variants patch one function for the duration of their run (`unittest.mock.patch`); nothing
is written into the checkpoint. Evaluations and fine-tunes go under `--work` (a temporary folder
by default).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

import genome_lm.model.ops.dsa.chunk as dsa_chunk
import genome_lm.model.ops.kda as kda_step
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.ops.kda.chunk import kda_gate

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def banded_attention(window: int, restart: bool = False):
    """`dense_latent_attention` with each query seeing its last `window` keys (itself included), or
    with `restart`, only the keys of its own block of `window` tokens (blocks start at 0, W, 2W ...)."""

    def attend(q: torch.Tensor, kv: torch.Tensor, scale: float) -> torch.Tensor:
        B, T, H, R = q.shape
        k = dsa_chunk._acc(kv)[:, None].expand(B, H, T, R)
        i = torch.arange(T, device=q.device)
        lag = i[:, None] - i[None, :]
        same = (i[:, None] // window) == (i[None, :] // window) if restart else lag < window
        mask = (lag >= 0) & same  # [T, T]
        o = F.scaled_dot_product_attention(dsa_chunk._acc(q).transpose(1, 2), k, k, attn_mask=mask, scale=scale)
        return o.transpose(1, 2).to(q.dtype)

    return mock.patch.object(dsa_chunk, "dense_latent_attention", attend)


def kda_restart(window: int):
    """Every KDA layer run on each block of `window` tokens on its own (blocks start at 0, W, 2W ...):
    its short convolution and its recurrent state start from zero at every block, as at the start of
    a sequence. The training path only (no cache); T must be a multiple of `window`."""
    forward = LongKDA.forward

    def blocked(self, hidden_states, *args, attention_mask=None, **kwargs):
        B, T, D = hidden_states.shape
        if T % window:
            raise ValueError(f"kda_restart({window}): {T} tokens are not a whole number of blocks")
        if attention_mask is not None:
            attention_mask = attention_mask.reshape(B * T // window, window)
        out = forward(self, hidden_states.reshape(B * T // window, window, D), *args,
                      attention_mask=attention_mask, **kwargs)
        return out.reshape(B, T, -1)

    return mock.patch.object(LongKDA, "forward", blocked)


def kda_time_scale(c: float):
    """`chunk_kda` as called by the KDA layer, with beta and the forget gate's log decay divided by c."""
    core = kda_step.chunk_kda

    def scaled(q, k, v, g, beta, **kw):
        if kw.get("use_gate_in_kernel"):  # g is the gate's raw input: apply the gate here
            g = kda_gate(g, kw["A_log"], kw["dt_bias"], kw["lower_bound"])
            kw.update(use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None)
        return core(q, k, v, g / c, beta / c, **kw)

    return mock.patch.object(kda_step, "chunk_kda", scaled)


def ablation(summary: dict) -> dict:
    ab = summary["context_ablation"]
    return {"overall_nll": summary["overall"]["mean_nll"],
            "by_length": [{k: r[k] for k in ("L", "mean_nll", "ci_low", "ci_high", "tokens")} for r in ab["by_length"]],
            "span": ab["span"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("shards", type=Path)
    ap.add_argument("--context", default="256,1k,2k,4k,7k", help="eval --context (default 256,1k,2k,4k,7k)")
    ap.add_argument("--windows", type=int, default=12, help="eval windows (default 12, as make demo)")
    ap.add_argument("--attention-window", type=int, nargs="*", default=[], metavar="W")
    ap.add_argument("--kda-time-scale", type=float, nargs="*", default=[], metavar="C")
    ap.add_argument("--finetune-steps", type=int, default=0, help="with --kda-time-scale: fine-tune first (0: no)")
    ap.add_argument("--work", type=Path, default=None, help="where evals and fine-tunes go (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/probe_context_reach.json"))
    args = ap.parse_args()

    from genome_lm.config import load_experiment
    from genome_lm.eval import EvalConfig, evaluate
    from genome_lm.genome.shards import load_manifest
    from genome_lm.train import train
    from genome_lm.train.checkpoint import resolve_model_dir

    topk = json.loads((resolve_model_dir(args.checkpoint) / "config.json").read_text()).get("index_topk", 0)
    window = load_manifest(args.shards)["parameters"]["seq_len"]
    if args.finetune_steps and not args.kda_time_scale:
        raise SystemExit("probe_context_reach: --finetune-steps fine-tunes the --kda-time-scale variants; give one")
    if args.attention_window and topk < window:
        raise SystemExit(f"probe_context_reach: --attention-window needs dense DSA; {args.checkpoint} has "
                         f"index_topk {topk}, below the shards' {window}-token windows")
    variants = [("as trained", {}, nullcontext)]
    variants += [(f"attention window {w}", {"attention_window": w}, lambda w=w: banded_attention(w))
                 for w in args.attention_window]
    for c in args.kda_time_scale:
        variants.append((f"KDA time scale {c:g}", {"kda_time_scale": c}, lambda c=c: kda_time_scale(c)))
        if args.finetune_steps:
            variants.append((f"KDA time scale {c:g}, fine-tuned {args.finetune_steps} steps",
                             {"kda_time_scale": c, "finetune_steps": args.finetune_steps},
                             lambda c=c: kda_time_scale(c)))

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for i, (name, fields, patch) in enumerate(variants):
            print(f"== {name}", flush=True)
            checkpoint = args.checkpoint
            with patch():
                if fields.get("finetune_steps"):
                    run = work / f"finetune_{i}"
                    exp = load_experiment(EXPERIMENTS / "demo_longctx.yaml", [
                        f"train.steps={fields['finetune_steps']}", f"data.shards={args.shards}",
                        f"model.init={args.checkpoint}", f"data.seq_len={window}"])
                    train(exp, out=run, resume=False)
                    checkpoint = run / "checkpoints" / "last"
                summary = evaluate(EvalConfig(checkpoint=str(checkpoint), shards=str(args.shards),
                                              out=str(work / f"eval_{i}"), max_windows=args.windows,
                                              context=args.context))
            rows.append({"variant": name, **fields, **ablation(summary)})

    lengths = [r["L"] for r in rows[0]["by_length"]]
    print(f"\n{'variant':<40} {'overall':>8} " + " ".join(f"{'L=' + str(L):>8}" for L in lengths)
          + "   span (nats) [95% CI]")
    for r in rows:
        s = r["span"]
        per_length = " ".join(f"{b['mean_nll']:>8.4f}" for b in r["by_length"])
        print(f"{r['variant']:<40} {r['overall_nll']:>8.4f} {per_length}"
              f"   {s['mean_delta']:+.4f} [{s['ci_low']:+.4f}, {s['ci_high']:+.4f}]")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"checkpoint": str(args.checkpoint), "shards": str(args.shards),
                                    "context": args.context, "windows": args.windows, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
