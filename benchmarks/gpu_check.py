"""The prepared GPU check: one command to run on a CUDA machine (under 8 minutes on one H200).

    python benchmarks/gpu_check.py                     # CUDA: every check, full sizes
    python benchmarks/gpu_check.py --device cpu        # the same checks at tiny sizes (the test suite runs it)

Checks, each recorded with its numbers and `ok`:
  kda          `chunk_kda` (fla's Triton kernels on CUDA) against the torch path, forward and
               backward, T not a multiple of 64, initial-state gradients
  offload      a glm53-tiny bf16 training step with per-layer recompute and layer-input offload
               (pinned host memory, side stream) equals in loss and gradient norm the same step
               without offload
  fsdp         FSDP2 on a 1-rank mesh (NCCL on CUDA, gloo on CPU) with the bf16 policy: float32
               master weights, bf16 compute, float32 exceptions; the step's loss equals the plain
               bf16 model's
  fp32_experts a float32 MoE forward on the device (torch's grouped_mm takes bf16 only on CUDA)
  eval         streaming against parallel per-token NLL on the device
  throughput   tokens/s and model FLOPs utilisation (6 x active parameters per token) of a
               mid-size config of the real architecture (GLM-5.3-Flash widths, few layers and
               experts) at --tokens; `assume.matmul_efficiency` is that utilisation, for
               `genome-lm plan --assume benchmarks/results/gpu_check.json`

Writes benchmarks/results/gpu_check.json (or --out) and prints a table; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.json"
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "B200": 2250e12}  # dense bf16 FLOP/s


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def check_kda(device: torch.device, quick: bool) -> dict:
    from genome_lm.model.ops.kda.chunk import chunk_kda, chunk_kda_torch, l2norm

    B, T, H, K = (1, 100, 2, 16) if quick else (2, 1000, 4, 128)
    gen = torch.Generator().manual_seed(0)
    q, k = (l2norm(torch.randn(B, T, H, K, generator=gen)) for _ in range(2))
    v = torch.randn(B, T, H, K, generator=gen)
    g = -5 * torch.sigmoid(2 * torch.randn(B, T, H, K, generator=gen))
    beta = torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, K, K, generator=gen)

    def run(fn):
        xs = [x.to(device).requires_grad_() for x in (q, k, v, g, beta, h0)]
        o, S = fn(*xs[:5], initial_state=xs[5], output_final_state=True)
        ((o * o).sum() + (S * S).sum()).backward()
        return [o.detach(), S.detach()] + [x.grad for x in xs]

    t0 = time.perf_counter()
    got = run(chunk_kda)
    _sync(device)
    kernel_s = time.perf_counter() - t0
    want = run(chunk_kda_torch)
    names = ["o", "S", "dq", "dk", "dv", "dg", "dbeta", "dh0"]
    errors = {n: _rel(a, b) for n, a, b in zip(names, got, want)}
    return {"ok": max(errors.values()) < 1e-3, "shape": [B, T, H, K], "max_rel_error": errors, "seconds": kernel_s,
            "backend": "fla" if device.type == "cuda" else "torch"}


def _tiny_step(device: torch.device, memory: dict, sharded: bool, compute_dtype, T: int) -> tuple[float, float]:
    """One forward+backward of glm53-tiny (seed 0) on [2, T] tokens through `parallelize`: (loss, grad norm)."""
    from genome_lm.config import MemoryConfig, ParallelConfig
    from genome_lm.model import build
    from genome_lm.parallel import clip_grad_norm_
    from genome_lm.parallel.mesh import ParallelContext, init_parallel
    from genome_lm.train.parallelize import parallelize

    torch.manual_seed(0)
    model = build("glm53-tiny", dtype="bfloat16", device=device).model
    par = init_parallel(ParallelConfig(), device, sharded=True) if sharded else ParallelContext(device=device)
    try:
        parallelize(model, MemoryConfig(**memory), par, compute_dtype)
        ids = torch.randint(0, 8, (2, T), generator=torch.Generator().manual_seed(1)).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = float(clip_grad_norm_([p for p in model.parameters() if p.requires_grad], math.inf))
    finally:
        par.shutdown()
    return float(loss.detach()), norm


def check_offload(device: torch.device, quick: bool) -> dict:
    T = 64 if quick else 1024
    plain = _tiny_step(device, {"recompute": "per-layer"}, True, torch.bfloat16, T)
    offload = _tiny_step(device, {"recompute": "per-layer", "offload_layer_inputs": True}, True, torch.bfloat16, T)
    return {"ok": plain[0] == offload[0] and abs(plain[1] - offload[1]) <= 1e-4 * plain[1],
            "loss": [plain[0], offload[0]], "grad_norm": [plain[1], offload[1]]}


def check_fsdp(device: torch.device, quick: bool) -> dict:
    T = 64 if quick else 1024
    fsdp = _tiny_step(device, {}, True, torch.bfloat16, T)
    plain = _tiny_step(device, {}, False, None, T)  # the bf16 model as built: bf16 compute, no master weights
    return {"ok": abs(fsdp[0] - plain[0]) <= 1e-3 * abs(plain[0]), "loss_fsdp": fsdp[0], "loss_plain_bf16": plain[0],
            "grad_norm": [fsdp[1], plain[1]]}


def check_fp32_experts(device: torch.device, quick: bool) -> dict:
    from genome_lm.model import apply_long_context, build

    torch.manual_seed(0)
    model = build("glm53-tiny", device=device).model
    apply_long_context(model)
    ids = torch.randint(0, 8, (1, 128), device=device)
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids).loss)
    return {"ok": math.isfinite(loss), "loss": loss}


def check_eval(device: torch.device, quick: bool) -> dict:
    from genome_lm.eval.scoring import score_piece
    from genome_lm.model import apply_long_context, build

    torch.manual_seed(0)
    model = build("glm53-tiny", device=device).model
    apply_long_context(model)
    model.eval()
    T = 150 if quick else 4096
    ids = torch.randint(0, 8, (1, T), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[:, 0] = -100
    a = score_piece(model, ids.to(device), labels.to(device), engine="parallel")
    b = score_piece(model, ids.to(device), labels.to(device), engine="streaming")
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    both = ~(a.isnan() | b.isnan())
    diff = float((a[both] - b[both]).abs().max())
    return {"ok": diff < 1e-4, "tokens": T, "max_abs_nll_diff": diff}


def check_throughput(device: torch.device, quick: bool, tokens: int) -> dict:
    """Training steps (forward+backward, bf16, per-layer recompute) of GLM-5.3-Flash widths with
    few layers and experts."""
    from genome_lm.config import MemoryConfig
    from genome_lm.model import build, count_parameters
    from genome_lm.train.parallelize import parallelize

    overrides = ({"num_hidden_layers": 2}
                 if quick else {"num_hidden_layers": 4, "n_routed_experts": 8, "num_experts_per_tok": 8,
                                "vocab_size": 16})
    name = "glm53-tiny" if quick else "glm53-flash"
    torch.manual_seed(0)
    model = build(name, dtype="bfloat16", device=device, meta=False, **overrides).model
    parallelize(model, MemoryConfig(recompute="per-layer", moe_block_tokens=8192, loss_chunk_tokens=4096))
    active = count_parameters(model)["active"] - model.model.embed_tokens.weight.numel()
    T = 128 if quick else tokens
    ids = torch.randint(0, 8, (1, T), device=device)
    times = []
    for _ in range(1 if quick else 3):
        _sync(device)
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        _sync(device)
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    step = min(times[1:] or times)
    tok_s = T / step
    out = {"ok": True, "config": {"preset": name, **overrides, "tokens": T}, "active_params": active,
           "step_s": step, "tokens_per_s": tok_s}
    if device.type == "cuda":
        gpu = next((k for k in BF16_PEAK if k in torch.cuda.get_device_name(device)), None)
        if gpu:
            mfu = 6 * active * tok_s / BF16_PEAK[gpu]
            out.update(gpu=gpu, mfu=mfu, peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30)
    return out


CHECKS = {"kda": check_kda, "offload": check_offload, "fsdp": check_fsdp, "fp32_experts": check_fp32_experts,
          "eval": check_eval}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tokens", type=int, default=32768, help="sequence length of the throughput check")
    ap.add_argument("--only", nargs="*", choices=[*CHECKS, "throughput"], help="run only these checks")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run with --device cpu", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    quick = device.type == "cpu"
    if device.type == "cuda":
        from genome_lm.settings import set_tf32

        set_tf32(True)
    results: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "checks": {}}
    wanted = args.only or [*CHECKS, "throughput"]
    for name in wanted:
        t0 = time.perf_counter()
        try:
            if name == "throughput":
                res = check_throughput(device, quick, args.tokens)
            else:
                res = CHECKS[name](device, quick)
        except Exception as e:  # a failing check is recorded, the others still run
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
        res["wall_s"] = time.perf_counter() - t0
        results["checks"][name] = res
        print(f"{name:<14} {'ok' if res['ok'] else 'FAILED':<7} {res['wall_s']:7.1f} s  "
              f"{ {k: v for k, v in res.items() if k not in ('ok', 'wall_s', 'traceback')} }", flush=True)
    thr = results["checks"].get("throughput", {})
    if "mfu" in thr:
        results["assume"] = {"matmul_efficiency": round(min(1.0, thr["mfu"]), 4)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(args.out)
    failed = [n for n, r in results["checks"].items() if not r["ok"]]
    print(f"gpu_check: {len(wanted) - len(failed)} passed, {len(failed)} failed -> {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
