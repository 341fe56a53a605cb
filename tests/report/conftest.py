"""Three evals of the same windows with the runs behind them, as `make demo` leaves them: a base and
two fine-tunes of it (`model.init` = the base's checkpoint) at contexts 256 and 1k, each 4 steps of
2,048 tokens. The models are random glm53-tiny initialisations (seeds 0, 1, 2): what is tested is the
bookkeeping, not a gain."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

ROLES = {"base": (0, 256), "short": (1, 256), "long": (2, 1024)}  # role -> (model seed, training context)
STEPS, TOKENS_PER_STEP = 4, 2048


def _fake_run(run, seed: int, seq_len: int, init: str | None):
    from genome_lm.model import save_pretrained
    from tests.helpers import tiny_model

    step = run / "checkpoints" / f"step_{STEPS:08d}"
    save_pretrained(tiny_model(seed), step / "model")
    (run / "checkpoints" / "last").symlink_to(step.name)
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"seq_len": seq_len}, "model": {"init": init}}))
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, STEPS + 1):
            f.write(json.dumps({"step": s, "loss": 2.0 - 0.1 * s, "tokens": TOKENS_PER_STEP}) + "\n")
    return run / "checkpoints" / "last"


@pytest.fixture(scope="session")
def matched(eval_inputs, tmp_path_factory):
    from genome_lm.eval import EvalConfig, evaluate

    root = tmp_path_factory.mktemp("matched")
    base_ckpt = str(root / "runs" / "base" / "checkpoints" / "last")
    evals = {}
    for role, (seed, seq_len) in ROLES.items():
        ckpt = _fake_run(root / "runs" / role, seed, seq_len, None if role == "base" else base_ckpt)
        evals[role] = root / "evals" / role
        evaluate(EvalConfig(checkpoint=str(ckpt), shards=str(eval_inputs.shards), out=str(evals[role]),
                            max_windows=3, resamples=300, context=[64, 256]), show_progress=False)
    return SimpleNamespace(root=root, **evals)
