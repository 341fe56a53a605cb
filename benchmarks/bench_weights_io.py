"""Weights I/O side by side, hand-written against DCP. Hand-written: `genome_lm.model.weights` of
an earlier revision (`CheckpointReader.rows`: `safe_open(...).get_slice(key)[a:b]`; the streamed
`save_pretrained`). DCP: the package's `load_weights_` (DCP's `HuggingFaceStorageReader` with the
key layout of `layout.py`), and DCP's `HuggingFaceStorageWriter` given the full state dict.

The model: a one-layer glm53-flash at real width (hidden 4096, KDA 64 x 128 heads, MoE width 2048),
KDA + MoE, bf16 with upstream's float32 exceptions, `--experts` routed experts and `--vocab`
tokens. Its weights are written in a real checkpoint's layout (`model.language_model.*`,
`lm_head.weight`, per-expert keys, q/k/v conv, files of `--shard-mb` MiB + index json).
Each variant runs in 2 fresh processes (gloo, CPU, FSDP2 over 2 ranks): build on the meta device,
parallelize, then load (`load_weights_`); per rank it records the load time, the peak resident set
above the one the load began with (VmHWM), the tensor bytes read from the files (every
`get_slice(key)[...]` counted) and `/proc/self/io` rchar (read syscalls: headers; mmap reads are not
counted there), and a digest of the rank's tensors (the variants must load the same bytes). Then
rank 0 writes the model back both ways (time, peak resident set). The variants alternate
`--repeats` times; each number is the smallest of its repeats.

    python benchmarks/bench_weights_io.py [--experts 16] [--vocab 32768] [--shard-mb 256] [--repeats 2]
        [--baseline REV]

Writes benchmarks/results/bench_weights_io.json and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from genome_lm.parallel.launch import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WEIGHTS = "genome_lm/model/weights"


def overrides(experts: int, vocab: int) -> dict:
    return dict(num_hidden_layers=1, layer_types=["linear_attention"], mlp_layer_types=["sparse"],
                indexer_types=["full"], n_routed_experts=experts, num_experts_per_tok=min(8, experts),
                vocab_size=vocab)


def baseline_package(rev: str | None, into: Path) -> str:
    """The hand-written reader of revision `rev` (default: the newest one whose layout.py still has
    `read_rows`) as package `old_weights` under `into`; returns the revision."""
    if rev is None:
        revs = subprocess.run(["git", "log", "--format=%H", "--", f"{WEIGHTS}/layout.py"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.split()
        rev = next(r for r in revs if "def read_rows" in subprocess.run(
            ["git", "show", f"{r}:{WEIGHTS}/layout.py"], cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    (into / "old_weights").mkdir()
    for name in ("__init__", "layout", "reader", "writer"):
        text = subprocess.run(["git", "show", f"{rev}:{WEIGHTS}/{name}.py"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        (into / "old_weights" / f"{name}.py").write_text(text.replace("genome_lm.model.weights", "old_weights"))
    return rev


def write_real_layout(out: Path, experts: int, vocab: int, shard_bytes: int) -> int:
    """Random weights of the benchmark model in a full GLM-5.3-Flash checkpoint's layout; returns bytes."""
    from safetensors.torch import save_file

    from genome_lm.model import build
    from genome_lm.model.weights.layout import model_tensors, to_disk_layout
    from genome_lm.model.weights.writer import byte_batches

    model = build("glm53-flash", dtype=torch.bfloat16, meta=True, **overrides(experts, vocab)).model
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    parts = []
    for name, tensor in model_tensors(model).items():
        tensor.normal_(std=0.02)
        for key, _, part in to_disk_layout(name, tensor):
            parts.append((key.replace("model.", "model.language_model.", 1), part.contiguous()))
    out.mkdir()
    files = list(byte_batches(parts, lambda p: p[1].nbytes, shard_bytes))
    names = [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    for name, batch in zip(names, files):
        save_file(dict(batch), str(out / name), metadata={"format": "pt"})
    index = {"weight_map": {key: name for name, batch in zip(names, files) for key, _ in batch}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return sum(p.nbytes for _, p in parts)


class _CountingSlices:
    """`safe_open` whose `get_slice(key)[...]` adds the bytes it returns to `READ[0]`."""

    READ = [0]

    def __init__(self, real, *args, **kwargs):
        self.f = real(*args, **kwargs)

    def __enter__(self):
        self.f.__enter__()
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def get_slice(self, key):
        part = self.f.get_slice(key)
        counter = self.READ

        class Slice:
            def __getitem__(self, index):
                tensor = part[index]
                counter[0] += tensor.nbytes
                return tensor

            def __getattr__(self, name):
                return getattr(part, name)

        return Slice()


def _io(field: str) -> int:
    return int(next(line.split()[1] for line in open("/proc/self/io") if line.startswith(field + ":")))


def _measure(fn):
    """fn() -> (result, seconds, peak resident bytes above the start, tensor bytes read, rchar)."""
    from genome_lm.train.metrics import proc_status_kb, reset_rss_peak, rss_peak

    start_rss, start_rchar = (proc_status_kb("VmRSS") or 0) * 1024, _io("rchar")
    reset_rss_peak()
    _CountingSlices.READ[0] = 0
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0, rss_peak() - start_rss, _CountingSlices.READ[0], _io("rchar") - start_rchar


def _worker(rank: int, world: int, port: int, variant: str, args: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import functools

    import safetensors

    from genome_lm.config import MemoryConfig, ParallelConfig
    from genome_lm.model import build
    from genome_lm.parallel.mesh import init_parallel
    from genome_lm.train.parallelize import parallelize

    sys.path.insert(0, args["baseline_dir"])
    if variant == "dcp":
        from genome_lm.model.weights import reader
        safetensors.safe_open = functools.partial(_CountingSlices, safetensors.safe_open)
    else:
        from old_weights import reader  # type: ignore[import-not-found,no-redef]
        reader.safe_open = functools.partial(_CountingSlices, reader.safe_open)
    par = init_parallel(ParallelConfig())
    built = build("glm53-flash", dtype=torch.bfloat16, meta=True, **overrides(args["experts"], args["vocab"]))
    parallelize(built.model, MemoryConfig(), par)
    par.barrier()
    _, seconds, peak, read, rchar = _measure(
        lambda: reader.load_weights_(built.model, args["weights"], par.device, dtype=built.dtype))
    locals_ = [t.to_local() if hasattr(t, "to_local") else t for t in built.model.state_dict().values()]
    digest = hashlib.sha256(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in locals_)).hexdigest()
    row = {"load_s": seconds, "load_peak_rss": peak, "bytes_read": read, "rchar": rchar, "digest": digest,
           "share_bytes": sum(t.nbytes for t in locals_)}
    par.barrier()
    target = Path(out, f"export_{variant}")
    if variant == "dcp":  # DCP's writer: the full state dict on rank 0, in the on-disk layout, one dcp.save
        save = functools.partial(_dcp_save, built.model, target, par, args)
    else:  # the hand-written writer: streamed, one tensor gathered at a time, files written as they fill
        from old_weights.writer import save_pretrained  # type: ignore[import-not-found]

        save = functools.partial(save_pretrained, built.model, target, write=rank == 0,
                                 max_shard_bytes=args["shard_bytes"])
    _, row["save_s"], row["save_peak_rss"], _, _ = _measure(save)
    par.barrier()
    Path(out, f"{variant}.rank{rank}.json").write_text(json.dumps(row))
    par.shutdown()


def _dcp_save(model, target: Path, par, args: dict) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from genome_lm.model.weights.layout import to_disk_layout
    from genome_lm.model.weights.writer import byte_batches

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if par.is_main:
        disk = {key: part for name, t in full.items() for key, _, part in to_disk_layout(name, t)}
        batches = byte_batches(disk.items(), lambda item: item[1].nbytes, args["shard_bytes"])
        files = {key: i for i, batch in enumerate(batches, 1) for key, _ in batch}
        dcp.save(disk, storage_writer=HuggingFaceStorageWriter(str(target), fqn_to_index_mapping=files), no_dist=True)


def _files(directory: Path) -> dict[str, list[str] | None]:
    """Each written file: its name -> the metadata keys in its header (safetensors) or None."""
    from safetensors import safe_open

    out: dict[str, list[str] | None] = {}
    for path in sorted(directory.iterdir()):
        out[path.name] = None
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as f:
                out[path.name] = sorted(f.metadata() or {})
    return out


def _table(result: dict) -> str:
    lines = [f"{'':28}{'hand-written':>16}{'DCP':>16}{'DCP / hand':>12}"]
    for key, label, scale in (("load_s", "load time (s)", 1), ("load_peak_rss", "load peak RSS (MiB)", 2**20),
                              ("bytes_read", "tensor bytes read (MiB)", 2**20), ("rchar", "rchar (MiB)", 2**20),
                              ("save_s", "save time (s)", 1), ("save_peak_rss", "save peak RSS (MiB)", 2**20)):
        for rank in range(result["world"]):
            hand, dcp = result["handwritten"][rank][key], result["dcp"][rank][key]
            name = f"{label} r{rank}"
            ratio = dcp / hand if hand else float("nan")
            lines.append(f"{name:28}{hand / scale:16.2f}{dcp / scale:16.2f}{ratio:12.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--shard-mb", type=float, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--baseline", default=None, help="revision of the hand-written reader (default: the newest "
                                                          "whose layout.py has read_rows)")
    args = parser.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed tensors go back to the OS (children inherit it)
    world, shard_bytes = 2, int(args.shard_mb * 2**20)
    with tempfile.TemporaryDirectory() as tmp:
        rev = baseline_package(args.baseline, Path(tmp))
        weights = Path(tmp) / "weights"
        total = write_real_layout(weights, args.experts, args.vocab, shard_bytes)
        job = dict(experts=args.experts, vocab=args.vocab, weights=str(weights), shard_bytes=shard_bytes,
                   baseline_dir=tmp)
        result: dict = {"experts": args.experts, "vocab": args.vocab, "checkpoint_bytes": total, "world": world,
                        "shard_bytes": shard_bytes, "baseline": rev,
                        "files": len(list(weights.glob("*.safetensors")))}
        runs: dict[str, list[list[dict]]] = {"handwritten": [], "dcp": []}
        for _ in range(args.repeats):
            for variant in runs:
                shutil.rmtree(Path(tmp, f"export_{variant}"), ignore_errors=True)
                mp.start_processes(_worker, args=(world, free_port(), variant, job, tmp), nprocs=world,
                                   start_method="spawn")
                runs[variant].append([json.loads(Path(tmp, f"{variant}.rank{r}.json").read_text())
                                      for r in range(world)])
        for variant, records in runs.items():  # per rank, each number the smallest of the repeats
            result[variant] = [{key: min(run[r][key] for run in records) for key in records[-1][r] if key != "digest"}
                               for r in range(world)]
        result["same_tensors"] = all(len({run[r]["digest"] for records in runs.values() for run in records}) == 1
                                     for r in range(world))
        result["written"] = {variant: _files(Path(tmp, f"export_{variant}")) for variant in ("handwritten", "dcp")}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_weights_io.json").write_text(json.dumps(result, indent=2) + "\n")
    share = result["dcp"][0]["share_bytes"] / 2**20
    print(f"{args.experts} experts, vocab {args.vocab}: checkpoint {total / 2**20:.0f} MiB in {result['files']} "
          f"files; each rank's share {share:.0f} MiB; same tensors: {result['same_tensors']}")
    print(_table(result))


if __name__ == "__main__":
    main()
