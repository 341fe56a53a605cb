"""Auxiliary-loss-free expert balancing: the DeepSeek-V3 bias rule, step by step and in a run."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from genome_lm.config import load_experiment
from genome_lm.model import apply_long_context
from genome_lm.train import train
from genome_lm.train.trainer import ExpertBalancer
from tests.helpers import tiny_model, write_experiment
from tests.parallel.test_train_parallel import truncate_to

BIAS = "e_score_correction_bias"


def test_bias_moves_by_rate_times_sign_of_the_step_load_gap():
    model = apply_long_context(tiny_model(dtype="float32"))
    balancer = ExpertBalancer(model, rate=0.01)
    assert len(balancer.layers) == 5  # the five sparse-MLP layers of glm53-tiny
    start = [m.gate.e_score_correction_bias.clone() for m in balancer.layers]
    totals = [torch.zeros_like(s, dtype=torch.float64) for s in start]
    for _ in range(2):  # two micro-batches: loads are summed over the step
        model(torch.randint(0, 4, (2, 96)))
        balancer.accumulate()
        for t, m in zip(totals, balancer.layers):
            t += m.last_expert_counts.double()
    balancer.step()
    for s, t, m in zip(start, totals, balancer.layers):
        assert t.sum() == 2 * 2 * 96 * model.config.num_experts_per_tok
        want = s + 0.01 * torch.sign(t.mean() - t).float()
        torch.testing.assert_close(m.gate.e_score_correction_bias, want, rtol=0, atol=0)
    moved = [m.gate.e_score_correction_bias.clone() for m in balancer.layers]
    model(torch.randint(0, 4, (2, 96)))
    balancer.accumulate()
    balancer.step(update=False)  # a skipped step only forgets its counts
    balancer.step()  # nothing counted since: nothing moves
    assert all(torch.equal(a, m.gate.e_score_correction_bias) for a, m in zip(moved, balancer.layers))
    off = ExpertBalancer(model, rate=0.0)
    model(torch.randint(0, 4, (2, 96)))
    off.accumulate()
    off.step()
    assert not off.active and all(torch.equal(a, m.gate.e_score_correction_bias) for a, m in zip(moved, off.layers))


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _biases(ckpt):
    state = load_file(str(ckpt / "model" / "model.safetensors"))
    return {k: v for k, v in state.items() if k.endswith(BIAS)}


def test_rule_spreads_the_tokens_of_a_fixed_router():
    """Fixed weights, the same batch every step: the bias alone evens out the load."""
    model = apply_long_context(tiny_model(dtype="float32"))
    balancer = ExpertBalancer(model, rate=0.005)
    x = torch.randint(0, 4, (4, 128))

    def imbalance():
        with torch.no_grad():
            model(x)
        return max(float(m.last_expert_counts.max() / m.last_expert_counts.float().mean()) for m in balancer.layers)

    before = imbalance()
    for _ in range(60):
        imbalance()
        balancer.accumulate()
        balancer.step()
    after = imbalance()
    assert before > 1.8 and after < 0.75 * before, (before, after)


def test_biases_are_checkpointed_exported_and_resume_bitwise(tmp_path, tiny_shards):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards,
                           train={"steps": 8, "checkpoint_every": 4, "keep_checkpoints": 2,
                                  "moe_bias_update_rate": 0.05})
    run = tmp_path / "run"
    train(load_experiment(exp), out=run, show_progress=False)
    recs = _records(run)
    assert 0 < recs[-1]["moe_bias_max_abs"] <= 8 * 0.05 + 1e-6
    final = _biases(run / "checkpoints" / "last")
    assert len(final) == 5 and max(float(b.abs().max()) for b in final.values()) > 0
    resumed = truncate_to(run, tmp_path / "resumed", 4)
    train(load_experiment(exp), out=resumed, resume=True, show_progress=False)
    assert [r["loss"] for r in _records(resumed)][4:] == [r["loss"] for r in recs][4:]
    again = _biases(resumed / "checkpoints" / "last")
    assert all(torch.equal(again[k], final[k]) for k in final)
