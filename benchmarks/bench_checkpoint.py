"""How long training waits for a checkpoint: `train.checkpoint_mode` async against sync, side by side.

One process on CPU, a model of plain linear layers (--params-m million float32 parameters; the
default 85M gives, with AdamW's two moments, a train_state of about 1 GB) and the trainer's own
`genome_lm.train.checkpoint.CheckpointManager`. Both modes run in the same process, alternately: for each
round, an optimizer step, a save, then --work-s seconds of matrix multiplications standing in for
the next steps (the background write of an async save overlaps them), then the async save is
completed. Reported per mode: the stall (what `CheckpointManager.save` blocked the loop: copying the
state to host memory for async, the whole write for sync), and for async the background write
time. The first round of each mode is a warm-up (page cache, allocator) and is not counted.

Writes benchmarks/results/bench_checkpoint.json and prints a table.

    python benchmarks/bench_checkpoint.py [--params-m 85] [--repeats 3] [--work-s 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


class _Data:
    """A data position, as the trainer's stream keeps one."""

    def state_dict(self) -> dict:
        return {"position": 0}

    def load_state_dict(self, state: dict) -> None:
        pass


def build(params_m: int):
    """Linear layers of width 2048 holding about `params_m` million parameters, AdamW with its moments."""
    width = 2048
    layers = max(1, round(params_m * 1e6 / (width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def step(model, optimizer) -> None:
    loss = model(torch.randn(8, model[0].in_features)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def work(seconds: float) -> None:
    """Compute standing in for the training steps between checkpoints."""
    a = torch.randn(512, 512)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def run(params_m: int, rounds: int, work_s: float, root: Path) -> dict:
    from genome_lm.parallel.mesh import ParallelContext
    from genome_lm.train.checkpoint import CheckpointManager, state_bytes, train_state

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, optimizer, scheduler = build(params_m)
    step(model, optimizer)  # AdamW's moments exist
    data = _Data()
    size = state_bytes(train_state(model, optimizer, scheduler, data, 0))
    savers = {mode: CheckpointManager(root / mode, ParallelContext(), mode=mode, keep=1) for mode in ("sync", "async")}
    seen: dict[str, dict[str, list[float]]] = {mode: {"stall_s": [], "write_s": []} for mode in savers}
    n = 0
    for r in range(rounds + 1):
        for mode, ckpt in savers.items():
            n += 1
            step(model, optimizer)
            timings = ckpt.save(n, model, optimizer, scheduler, data, {}, export_model=False, export_dtype=None)
            work(work_s)
            timings.update(ckpt.wait())
            if r:  # the first pass warms up
                seen[mode]["stall_s"].append(timings["checkpoint_stall_s"])
                if "checkpoint_write_s" in timings:
                    seen[mode]["write_s"].append(timings["checkpoint_write_s"])
            print(f"round {r} {mode:>5}: " + ", ".join(f"{k} {v:.3f}" for k, v in timings.items()
                                                       if isinstance(v, float)), flush=True)
    for ckpt in savers.values():
        ckpt.close()
    out = {"train_state_bytes": size, "params": sum(p.numel() for p in model.parameters()), "rounds": rounds,
           "work_s": work_s, "threads": torch.get_num_threads(), "modes": {}}
    for mode, s in seen.items():
        out["modes"][mode] = {"stall_s": statistics.median(s["stall_s"]), "stall_all_s": s["stall_s"],
                              "write_s": statistics.median(s["write_s"]) if s["write_s"] else None}
    out["stall_ratio_sync_over_async"] = out["modes"]["sync"]["stall_s"] / out["modes"]["async"]["stall_s"]
    return out


def table(r: dict) -> str:
    lines = [f"train_state {r['train_state_bytes'] / 1e9:.2f} GB ({r['params'] / 1e6:.0f}M float32 parameters + "
             f"AdamW), {r['rounds']} rounds, {r['work_s']:g} s of work between saves, {r['threads']} threads",
             "| mode | training stall (median) | background write (median) |", "|---|---:|---:|"]
    for mode in ("sync", "async"):
        m = r["modes"][mode]
        write = f"{m['write_s']:.2f} s" if m["write_s"] is not None else "– (inside the stall)"
        lines.append(f"| {mode} | {m['stall_s']:.2f} s | {write} |")
    lines.append(f"stall ratio sync / async: {r['stall_ratio_sync_over_async']:.1f}x")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params-m", type=int, default=85)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work-s", type=float, default=3.0)
    ap.add_argument("--dir", type=Path, default=None, help="where the checkpoints are written (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "bench_checkpoint.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_checkpoint_") as root:
        result = run(args.params_m, args.repeats, args.work_s, Path(root))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
