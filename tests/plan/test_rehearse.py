"""`genome-lm rehearse`: the real model and training step on fake tensors and a fake process group,
measured by FSDP2's memory tracker, against the planner."""

import subprocess
import sys

import pytest

from genome_lm.config import load_experiment, parse_experiment
from genome_lm.plan.command import PlanParams, build
from genome_lm.plan.planner import make_plan
from genome_lm.plan.rehearse import rehearse

EXPERIMENT = "experiments/glm53flash_512k_64xb200.yaml"
GiB = 2**30


def _plan_and_config(seq_len: str, *sets: str):
    overrides = [f"data.seq_len={seq_len}", *sets]
    shape, layout, cluster, assume, _ = build(PlanParams(experiment=EXPERIMENT, overrides=overrides, gpus=64))
    cfg = load_experiment(EXPERIMENT, overrides)
    cfg.parallel.dp = "auto"
    return make_plan(shape, layout, cluster, assume), cfg


@pytest.mark.parametrize("seq_len, sets", [
    ("32k", ()), ("128k", ()),
    pytest.param("256k", ("memory.moe_block_tokens=1k",), marks=pytest.mark.slow),  # about 200 s on 2 cores
])
def test_full_width_rehearsal_on_64_ranks_agrees_with_the_planner(seq_len, sets):
    """GLM-5.3-Flash at real width (288 experts, ep 8, cp 8, 64 ranks): the tracked peak, its place
    and its parts are the planner's within 5%. At 32k a rank's 4k tokens are one MoE block; at 128k
    they are four, and each block's backward adds a new gradient of the rank's expert weights to
    the one before. At 256k in 1k-token MoE blocks the peak is in the DSA attention's backward, as
    at 1M."""
    plan, cfg = _plan_and_config(seq_len, *sets)
    r = rehearse(cfg, 64, plan=plan, show_progress=False)
    assert r.layers < r.total_layers == 45
    assert abs(r.difference) <= 0.05, (r.peak, plan.memory.peak_where, plan.memory.breakdown)
    # the first DSA+MoE layer's backward, as planned
    assert r.peak.phase == "backward" and f"{r.peak.module}.".startswith("FSDPGlm5NextCausalLM.model.layers.3.")
    assert plan.memory.peak_where.startswith("backward of layer 3 ")
    params = r.peak.kinds["Sharded Param"]
    assert params == pytest.approx(plan.memory.breakdown["parameters"], rel=0.01)  # FSDP2's padding included
    assert r.host_bytes == pytest.approx(plan.host_bytes_per_gpu, rel=0.05)
    # what the step adds to the persistent shards (FSDP2 buffers, activations, temporaries): the planner's
    # model of these, FSDP2's gathered layers among them, within 5%
    persistent = ("Sharded Param", "OptState", "Sharded Grad")
    step = r.peak.total - sum(r.peak.kinds.get(k, 0) for k in persistent)
    planned = plan.peak_gpu_bytes - sum(plan.memory.breakdown.get(k, 0)
                                        for k in ("parameters", "optimizer_states", "gradients"))
    assert planned == pytest.approx(step, rel=0.05), (step / GiB, planned / GiB)


def _tiny(layers: int, T: int = 1024):
    kinds = ["linear_attention", "linear_attention", "linear_attention", "indexed_attention"] * 4
    raw = {"data": {"shards": "-", "seq_len": T},
           "model": {"name": "glm53-tiny", "dtype": "bfloat16",
                     "overrides": {"num_hidden_layers": layers, "layer_types": kinds[:layers],
                                   "indexer_types": ["full"] * layers,
                                   "mlp_layer_types": ["dense"] + ["sparse"] * (layers - 1)}},
           "train": {"steps": 2, "optimizer_state_dtype": "bfloat16"},
           "memory": {"recompute": "per-layer", "offload_layer_inputs": True, "moe_block_tokens": 256},
           "parallel": {"cp": 2, "dp": "auto", "ep": 2, "reduce_dtype": "bfloat16", "backward_prefetch": 0}}
    return parse_experiment(raw, "tiny")


def test_fewer_layers_scale_to_what_all_layers_measure():
    """The first layers of each kind, lifted by the omitted layers' shards, give the peak, its parts
    and the host memory that rehearsing every layer gives (12-layer glm53-tiny, 8 ranks, cp 2, ep 2)."""
    cfg = _tiny(12)
    few = rehearse(cfg, 8, show_progress=False)
    every = rehearse(cfg, 8, layers=12, show_progress=False)
    assert few.layers == 5 and every.layers == 12
    assert few.peak.total == pytest.approx(every.peak.total, rel=0.01)
    for kind in ("Sharded Param", "OptState", "Sharded Grad"):
        assert few.peak.kinds[kind] == pytest.approx(every.peak.kinds[kind], rel=0.02), kind
    assert few.host_bytes == pytest.approx(every.host_bytes, rel=0.01)


def test_the_rehearsal_runs_the_trainers_step(monkeypatch):
    """Each rehearsed step is one call of the trainer's `train_step`, with the rehearsal's fake-tensor
    model and no checkpoints."""
    from genome_lm.train import trainer

    calls = []
    real = trainer.train_step

    def spy(parts, batches, optimizer_phase=None):
        calls.append((parts.checkpoints, len(batches)))
        return real(parts, batches, optimizer_phase)

    monkeypatch.setattr(trainer, "train_step", spy)
    rehearse(_tiny(5), 8, show_progress=False)
    assert calls == [(None, 1)] * 2  # the default two steps


@pytest.mark.parametrize("args, message", [
    (["--layers", "3", "--set", "memory.offload_layer_inputs=false"], "--layers 3: fewer layers scale up only with"),
    (["--layers", "99"], "--layers 99: glm53-flash has 45 decoder layers"),
    (["--steps", "1"], "--steps: must be >= 2"),  # genome_lm's check, not argparse's "unrecognized arguments"
])
def test_bad_input_is_one_line_exit_2(args, message):
    cmd = [sys.executable, "-m", "genome_lm", "rehearse", EXPERIMENT, "--gpus", "64", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"genome-lm rehearse: error: {message}"), line
