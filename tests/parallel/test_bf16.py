"""bf16 GLM-5.3-Flash-style training under FSDP2 (glm53-tiny, `model.dtype: bfloat16`): float32
master weights sharded by FSDP2, bf16 compute, upstream's float32 exceptions gathered and computed
in float32 (`genome_lm.parallel`). On 2 processes (dp 2, and cp 2) it runs, checkpoints and
resumes with identical losses, and its losses stay within bf16 tolerance of the float32 run.

Global batch 2 sequences per step, as in test_train_parallel.py.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from genome_lm.cli import main
from genome_lm.config import load_experiment
from genome_lm.train import train
from tests.helpers import tiny_model, write_experiment

from .test_train_parallel import assert_same_curve, records, truncate_to

BF16 = dict(rel=1e-2)  # bf16 compute against the float32 run, 4 steps at lr 3e-3


def _bf16_run(root, shards, *flags: str):
    exp = write_experiment(root / "e.yaml", shards, micro_batch=1, model={"dtype": "bfloat16"})
    os.environ.setdefault("TQDM_DISABLE", "1")
    assert main(["train", exp, "--out", str(root / "run"), "--nproc", "2", *flags]) == 0
    return exp, root / "run"


@pytest.fixture(scope="module")
def fp32_curve(tmp_path_factory, tiny_shards):
    root = tmp_path_factory.mktemp("fp32")
    exp = write_experiment(root / "e.yaml", tiny_shards, micro_batch=1)
    train(load_experiment(exp, ["train.micro_batch=2"]), out=root / "run")
    return records(root / "run")


@pytest.mark.parametrize("layout", ["dp2", "cp2"])
def test_bf16_two_ranks_trains_checkpoints_and_resumes(layout, tiny_shards, fp32_curve, tmp_path):
    flags = ["--set", "parallel.cp=2", "--set", "data.seq_len=128"] if layout == "cp2" else []
    exp, run = _bf16_run(tmp_path, tiny_shards, *flags)
    got = records(run)
    want = fp32_curve
    if layout == "cp2":  # one sequence of 128 per step, split in two slabs: its own float32 reference
        one = tmp_path / "fp32_one"
        train(load_experiment(exp, ["model.dtype=float32", "data.seq_len=128"]), out=one)
        want = records(one)
    for step in range(1, 5):
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], **BF16), step
    assert got[4]["loss"] < got[1]["loss"]  # it learns
    last = run / "checkpoints" / "last"
    config = json.loads((last / "model" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    from safetensors import safe_open

    with safe_open(str(last / "model" / "model.safetensors"), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes["model.embed_tokens.weight"] == "BF16" and dtypes["model.layers.0.self_attn.A_log"] == "F32"
    resumed = truncate_to(run, tmp_path / "resumed", 2)
    assert main(["train", exp, "--out", str(resumed), "--nproc", "2", "--resume", *flags]) == 0
    assert_same_curve(records(resumed), got, range(1, 5))


def test_bf16_one_process_trains_and_resumes(tiny_shards, fp32_curve, tmp_path):
    """One process: a 1-rank FSDP2 mesh of its own, same numbers within bf16 tolerance."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, micro_batch=1, model={"dtype": "bfloat16"})
    run = tmp_path / "run"
    train(load_experiment(exp, ["train.micro_batch=2"]), out=run)
    got = records(run)
    for step in range(1, 5):
        assert got[step]["loss"] == pytest.approx(fp32_curve[step]["loss"], **BF16), step
    resumed = truncate_to(run, tmp_path / "resumed", 2)
    train(load_experiment(exp, ["train.micro_batch=2"]), out=resumed, resume=True)
    assert_same_curve(records(resumed), got, range(1, 5))


def test_fsdp_groups_float32_exceptions():
    """Every float32-exception parameter sits in an FSDP2 group of its own dtype, and the one
    process bf16 forward equals the plain bf16 model's (same bf16 compute)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from genome_lm.model import apply_long_context, build
    from genome_lm.model.weights.layout import keep_fp32
    from genome_lm.parallel import apply_fsdp, fp32_modules, to_master_dtype_

    plain = tiny_model(dtype="bfloat16")
    apply_long_context(plain)
    model = build("glm53-tiny", dtype="bfloat16").model
    model.load_state_dict(plain.state_dict())
    apply_long_context(model)
    owners = [name for name, _ in fp32_modules(model)]
    assert any(n.endswith("self_attn.conv1d") for n in owners) and any(n.endswith("mlp.gate") for n in owners)
    assert all(not keep_fp32(n) or any(n.startswith(o + ".") for o in owners) for n, _ in model.named_parameters())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        apply_fsdp(to_master_dtype_(model), init_device_mesh("cpu", (1,)), compute_dtype=torch.bfloat16)
        for name, _ in fp32_modules(model):
            sub = model.get_submodule(name)
            assert isinstance(sub, FSDPModule) and sub._get_fsdp_state()._mp_policy.param_dtype is None, name
        ids = torch.randint(0, 8, (1, 64))
        got = model(input_ids=ids, labels=ids).loss
        got.backward()
        assert float(got.detach()) == pytest.approx(float(plain(input_ids=ids, labels=ids).loss.detach()), rel=1e-6)
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for n, p in model.named_parameters()
                   if p.requires_grad and "indexer" not in n)
    finally:
        dist.destroy_process_group()


def test_bf16_reduce_scatter_and_no_backward_prefetch(tiny_shards, fp32_curve, tmp_path):
    """`parallel.reduce_dtype: bfloat16` (gradients reduce-scattered in bf16, the float32 groups
    still in float32) and `parallel.backward_prefetch: 0` on 2 processes: within bf16 tolerance of
    the float32 run, and it learns."""
    _, run = _bf16_run(tmp_path, tiny_shards, "--set", "parallel.reduce_dtype=bfloat16",
                       "--set", "parallel.backward_prefetch=0")
    got = records(run)
    for step in range(1, 5):
        assert got[step]["loss"] == pytest.approx(fp32_curve[step]["loss"], **BF16), step
    assert got[4]["loss"] < got[1]["loss"]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_backward_prefetch_and_reduce_dtype_reach_fsdp2(prefetch):
    """The `parallel:` knobs as FSDP2 sees them: each decoder layer's explicit backward prefetch
    list (0: itself only, FSDP2's default off; 2: the two layers before it) and the bf16
    reduce dtype of the layer groups, float32 kept for the float32-exception groups."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from genome_lm.model import apply_long_context
    from genome_lm.parallel import apply_fsdp, fp32_modules, to_master_dtype_

    model = apply_long_context(tiny_model(dtype="bfloat16"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        apply_fsdp(to_master_dtype_(model), init_device_mesh("cpu", (1,)), compute_dtype=torch.bfloat16,
                   reduce_dtype=torch.bfloat16, backward_prefetch=prefetch)
        layers = list(model.model.layers)
        for i, layer in enumerate(layers):
            want = [layer] if prefetch == 0 or i == 0 else layers[max(0, i - prefetch):i][::-1]
            got = layer._get_fsdp_state()._states_to_backward_prefetch
            assert got == [m._get_fsdp_state() for m in want], i
            assert layer._get_fsdp_state()._mp_policy.reduce_dtype == torch.bfloat16
        for name, _ in fp32_modules(model):
            assert model.get_submodule(name)._get_fsdp_state()._mp_policy.reduce_dtype == torch.float32, name
    finally:
        dist.destroy_process_group()


def test_expert_parallel_experts_become_float32_master_weights():
    """A bf16 model trained with expert parallelism keeps float32 master weights for its routed
    experts (DTensor parameters on the EP mesh) as for every other parameter."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from genome_lm.config import parse_experiment
    from genome_lm.parallel.mesh import init_parallel
    from genome_lm.train.parallelize import parallelize
    from genome_lm.train.trainer import build_model, compute_dtype

    cfg = parse_experiment({"data": {"shards": "-", "seq_len": 256},
                            "model": {"name": "glm53-tiny", "dtype": "bfloat16"},
                            "train": {"steps": 1}, "parallel": {"cp": 1, "dp": "auto", "ep": 2}}, "ep")
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        par = init_parallel(cfg.parallel, torch.device("cpu"), sharded=True)
        model = build_model(cfg, par.device, None, meta=True).model
        parallelize(model, cfg.memory, par, compute_dtype(cfg))
        dtypes = {n: p.dtype for n, p in model.named_parameters()}
    finally:
        dist.destroy_process_group()
    experts = {n: d for n, d in dtypes.items() if "experts.gate_up_proj" in n or "experts.down_proj" in n}
    assert experts and set(dtypes.values()) == {torch.float32}, experts
