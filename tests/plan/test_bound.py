"""The planner is a conservative bound on the rehearsal: on randomly drawn layouts of GLM-5.3-Flash at
real width (sequence, GPUs, cp / ep / dp, memory strategy, block sizes, dtypes, GPU type; seeded), the
planned peak per GPU is never more than 1% below what `rehearse` measures on fake tensors and at most
6% above it. Each layout is a full-width rehearsal (a few minutes on a CPU): the default run checks one
drawn layout of at most 8k tokens per rank; `-m slow` checks eight more of up to 32k."""

from __future__ import annotations

import random

import pytest

from genome_lm.config import load_experiment
from genome_lm.plan.command import PlanParams, build
from genome_lm.plan.planner import make_plan
from genome_lm.plan.rehearse import rehearse

EXPERIMENT = "experiments/glm53flash_512k_64xb200.yaml"
BELOW, ABOVE = 0.01, 0.06  # the planner may be this much under / over the rehearsal


def draw(rng: random.Random, max_rank_tokens: int) -> tuple[int, str, list[str]]:
    """(GPUs, GPU type, --set overrides) of one random layout with at most `max_rank_tokens` per rank."""
    gpus = rng.choice([8, 16, 32, 64, 128])
    seq = rng.choice([2**15, 2**16, 2**17, 2**18, 2**19, 2**20])
    cps = [cp for cp in (1, 2, 4, 8, 16, 32, 64, 128) if gpus % cp == 0 and seq // cp <= max_rank_tokens]
    cp = rng.choice(cps) if cps else gpus
    ep = rng.choice([ep for ep in (1, 2, 4, 8) if gpus % ep == 0])
    sets = [f"data.seq_len={seq}", f"parallel.cp={cp}", "parallel.dp=auto", f"parallel.ep={ep}",
            f"parallel.reduce_dtype={rng.choice(['float32', 'bfloat16'])}",
            f"parallel.backward_prefetch={rng.choice([0, 1])}",
            f"train.optimizer_state_dtype={rng.choice(['float32', 'bfloat16'])}",
            f"memory.moe_recompute={rng.choice(['true', 'false'])}",
            f"memory.moe_block_tokens={rng.choice([1024, 2048, 4096, 8192])}",
            f"memory.dsa_block_queries={rng.choice([128, 256, 512])}",
            f"memory.kda_head_block={rng.choice([0, 16, 32])}",
            f"memory.offload_keep_last={rng.choice([1, 2])}"]
    return gpus, rng.choice(["b200", "h200", "h100"]), sets


def ratio(gpus: int, gpu: str, sets: list[str]) -> float:
    """Planned peak / rehearsed peak per GPU of one layout."""
    shape, layout, cluster, assume, _ = build(PlanParams(experiment=EXPERIMENT, overrides=sets, gpus=gpus, gpu=gpu))
    plan = make_plan(shape, layout, cluster, assume)
    cfg = load_experiment(EXPERIMENT, sets)
    r = rehearse(cfg, gpus, plan=plan, show_progress=False)
    return plan.peak_gpu_bytes / r.peak.total


def check(seed: int, n: int, max_rank_tokens: int) -> None:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        gpus, gpu, sets = draw(rng, max_rank_tokens)
        out.append((ratio(gpus, gpu, sets), gpus, gpu, sets))
        print(f"planned / rehearsed {out[-1][0]:.4f}: {gpus} x {gpu} {' '.join(sets)}", flush=True)
    bad = [row for row in out if not 1 - BELOW <= row[0] <= 1 + ABOVE]
    assert not bad, bad


def test_planner_bounds_the_rehearsal_on_a_drawn_layout():
    check(seed=0, n=1, max_rank_tokens=8192)


@pytest.mark.slow
def test_planner_bounds_the_rehearsal_on_drawn_layouts():
    check(seed=1, n=8, max_rank_tokens=32768)
