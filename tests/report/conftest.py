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


def write_variants_output(d, labelled: bool = True):
    """A `genome-lm variants` output folder as docs/score.md specifies its summary.json: contexts 1k, 8k, 64k;
    long context separates the classes better (the numbers are made up, the schema is what is tested)."""
    import numpy as np

    contexts = [1024, 8192, 65536]
    fpr = np.linspace(0, 1, 50)
    metrics = {"strand": "both", "by_context": [], "paired_vs_shortest": [], "roc": [], "score_shift": []}
    for i, L in enumerate(contexts):
        auroc = 0.6 + 0.1 * i
        metrics["by_context"].append({"context": L, "n_pos": 40, "n_neg": 60, "auroc": auroc,
                                      "auroc_ci": [auroc - 0.05, auroc + 0.05], "auprc": auroc - 0.1,
                                      "auprc_ci": [auroc - 0.17, auroc - 0.03]})
        metrics["paired_vs_shortest"].append({"context": L, "d_auroc": 0.1 * i, "d_auroc_ci": [0.1 * i - 0.04,
                                              0.1 * i + 0.04], "d_auprc": 0.1 * i, "d_auprc_ci": [0.1 * i - 0.05,
                                                                                                 0.1 * i + 0.05]})
        metrics["roc"].append({"context": L, "fpr": fpr.tolist(), "tpr": (fpr ** (1 / (1 + i))).tolist()})
        metrics["score_shift"].append({"context": L, "mean_score": -0.5 - 0.2 * i, "mean_score_pos": -1.0 - 0.5 * i,
                                       "mean_score_neg": -0.2})
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({
        "command": "variants", "checkpoint": {"path": "runs/demo/checkpoints/last"},
        "reference": {"path": "genome.fa", "sha256": "0" * 64}, "contexts": contexts, "after": 0,
        "strands": ["+", "-", "both"], "variants": {"read": 103, "scored": 100, "skipped": {"ref_mismatch": 3,
                                                                                          "not_in_reference": 0},
                                                 "ref_mismatches": ["chr1:10 A>G (fasta: C)"]},
        "metrics": metrics if labelled else None, "resamples": 200, "seed": 0, "seconds": 1.0,
        "variants_per_second": 100.0}))
    return d
