"""Host memory of getting weights into a distributed run and writing `model/` out of it: a whole-model
baseline against the trainer's meta-device init + streamed export.

Two processes (gloo, CPU, FSDP2 over 2 ranks) and glm53-tiny widened to ~130 MB of fp32 weights
(hidden 256, 32 experts of width 256: the expert stacks dominate, as in GLM-5.3-Flash). Each
variant runs in fresh processes (with a fixed malloc mmap threshold, so freed tensors leave the
resident set) and records per rank the peak resident set of each phase above the resident set
when the phase began (`reset_rss_peak` / VmHWM, `genome_lm.train.metrics`):

  init    whole:    build the whole model, `build(weights)` builds a second whole model from the
                    directory and copies it in, then parallelize (FSDP2)
          streamed: what the trainer does: build on the meta device, parallelize, `to_empty`, each
                    rank reads its rows (`model.weights.reader.load_weights_`)
  export  whole:    `get_model_state_dict(full_state_dict=True, cpu_offload=True)` to rank 0, then
                    the whole on-disk state dict and one `save_file`
          streamed: `save_pretrained(write=rank == 0)`: one tensor gathered at a time, files of at
                    most `--shard-mb` MiB written as they complete

Writes benchmarks/results/bench_init_export.json and prints a table.

    python benchmarks/bench_init_export.py [--shard-mb 16]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

from genome_lm.parallel.launch import free_port

HERE = Path(__file__).resolve().parent
OVERRIDES = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, n_routed_experts=32)


def _phase(fn):
    """Run fn(); return (result, peak resident bytes above the resident set at the start)."""
    from genome_lm.train.metrics import proc_status_kb, reset_rss_peak, rss_peak

    start = proc_status_kb("VmRSS") * 1024
    if not reset_rss_peak():
        raise SystemExit("this kernel does not allow resetting VmHWM (/proc/self/clear_refs)")
    result = fn()
    return result, rss_peak() - start


def _whole_init(weights: str, par):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from genome_lm.config import MemoryConfig
    from genome_lm.model import build
    from genome_lm.train.parallelize import parallelize

    torch.manual_seed(0)
    model = build("glm53-tiny", **OVERRIDES).model
    loaded = build(weights).model
    set_model_state_dict(model, loaded.state_dict(), options=StateDictOptions(full_state_dict=True, strict=True))
    del loaded
    return parallelize(model, MemoryConfig(), par)


def _streamed_init(weights: str, par):
    from genome_lm.config import MemoryConfig
    from genome_lm.model import build
    from genome_lm.model.weights.reader import load_weights_
    from genome_lm.train.parallelize import parallelize

    built = build("glm53-tiny", meta=True, **OVERRIDES)
    parallelize(built.model, MemoryConfig(), par)
    load_weights_(built.model, weights, par.device, dtype=built.dtype)
    return built.model


def _whole_export(model, out: Path, par) -> None:
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from genome_lm.model.weights.layout import to_disk_layout

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if par.is_main:
        disk = {n: p.contiguous() for name, t in full.items() for n, _, p in to_disk_layout(name, t)}
        out.mkdir()
        save_file(disk, str(out / "model.safetensors"))


def _streamed_export(model, out: Path, par, shard_bytes: int) -> None:
    from genome_lm.model import save_pretrained

    save_pretrained(model, out, write=par.is_main, max_shard_bytes=shard_bytes)


def _worker(rank: int, world: int, port: int, variant: str, weights: str, shard_bytes: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from genome_lm.config import ParallelConfig
    from genome_lm.parallel.mesh import init_parallel

    par = init_parallel(ParallelConfig())
    init = _whole_init if variant == "whole" else _streamed_init
    model, init_peak = _phase(lambda: init(weights, par))
    par.barrier()
    target = Path(out) / f"export_{variant}"
    if variant == "whole":
        _, export_peak = _phase(lambda: _whole_export(model, target, par))
    else:
        _, export_peak = _phase(lambda: _streamed_export(model, target, par, shard_bytes))
    par.barrier()
    Path(out, f"{variant}.rank{rank}.json").write_text(json.dumps({"init": init_peak, "export": export_peak}))
    par.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shard-mb", type=float, default=16)
    args = parser.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed tensors go back to the OS (children inherit it)
    from genome_lm.model import build, save_pretrained

    world, shard_bytes = 2, int(args.shard_mb * 2**20)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(1)
        model = build("glm53-tiny", **OVERRIDES).model
        weights = str(save_pretrained(model, Path(tmp) / "weights", max_shard_bytes=shard_bytes))  # files as HF's
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        largest = max(p.numel() * p.element_size() for p in model.parameters())
        del model
        rows = {}
        for variant in ("whole", "streamed"):
            mp.start_processes(_worker, args=(world, free_port(), variant, weights, shard_bytes, tmp), nprocs=world,
                               start_method="spawn")
            rows[variant] = [json.loads(Path(tmp, f"{variant}.rank{r}.json").read_text()) for r in range(world)]
        files = sorted(p.name for p in (Path(tmp) / "export_streamed").glob("*.safetensors"))
    result = {"model_bytes": model_bytes, "largest_tensor_bytes": largest, "shard_bytes": shard_bytes,
              "world": world, "files_streamed": len(files), "peak_above_start_bytes": rows}
    (HERE / "results" / "bench_init_export.json").write_text(json.dumps(result, indent=2) + "\n")
    mib = 2**20
    print(f"glm53-tiny {OVERRIDES}: {model_bytes / mib:.1f} MiB fp32 weights, largest tensor {largest / mib:.1f} MiB; "
          f"{world} ranks; export files of <= {shard_bytes / mib:.0f} MiB ({len(files)} files)")
    print("| phase | rank | whole MiB | streamed MiB |")
    print("|---|---:|---:|---:|")
    for phase in ("init", "export"):
        for r in range(world):
            print(f"| {phase} | {r} | {rows['whole'][r][phase] / mib:.1f} | {rows['streamed'][r][phase] / mib:.1f} |")


if __name__ == "__main__":
    main()
