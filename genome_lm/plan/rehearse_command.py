"""`genome-lm rehearse`: argument handling and output; `cli.py` only registers it, the work is
`plan/rehearse.py`'s.

    genome-lm rehearse EXP.yaml --gpus 64 [--gpu b200|h200|h100] [--routing busiest|uniform]
        [--layers N|all] [--steps 2] [--set KEY=VALUE] [--assume KEY=VALUE]
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from genome_lm.errors import GenomeLMError


class RehearseParams(BaseModel):
    """The parameters of `genome-lm rehearse`: an experiment on N fake ranks, with the planner's
    prediction for the same run beside the measured figures."""

    model_config = ConfigDict(extra="forbid")

    experiment: str = Field(json_schema_extra={"positional": True}, description="experiment YAML")
    gpus: int = Field(ge=1, description="ranks of the fake process group (the experiment's dp becomes gpus / cp)")
    gpu: str = Field(default="b200", description="the GPU the planner's prediction is for: b200, h200 or h100")
    routing: Literal["busiest", "uniform"] = Field(default="busiest", description="routing assumed under expert "
                                                   "parallelism: this rank receives expert_imbalance x the mean "
                                                   "rows (the planner's assumption), or the mean")
    layers: int | Literal["all"] | None = Field(default=None, description="decoder layers to run (default: the "
                                                "first ones holding every layer kind, the rest added from their "
                                                "shards; 'all': every layer)")
    steps: int = Field(default=2, ge=2, description="training steps (the peak is taken after the first)")
    overrides: list[str] = Field(default=[], json_schema_extra={"flag": "--set", "repeat": True, "metavar": "KEY=V"},
                                 description="override an experiment value, e.g. --set data.seq_len=32k (repeatable)")
    assume: list[str] = Field(default=[], json_schema_extra={"repeat": True, "metavar": "KEY=VALUE"},
                              description="override a planner assumption (as genome-lm plan --assume); "
                              "expert_imbalance also sets the routing of --routing busiest")


def run(args: RehearseParams) -> None:
    from genome_lm.plan.command import PlanParams, build
    from genome_lm.plan.planner import make_plan
    from genome_lm.plan.rehearse import format_rehearsal, rehearse

    assume = list(args.assume)
    if args.routing == "uniform":
        assume.append("expert_imbalance=1")
    plan_args = PlanParams(experiment=args.experiment, overrides=args.overrides, gpus=args.gpus, gpu=args.gpu,
                           assume=assume)
    shape, layout, cluster, assumptions, _ = build(plan_args)
    cfg = experiment_for(args)
    if cfg.model.dtype == "float32" and cfg.parallel.ep == 1 and any(lay.mlp == "moe" for lay in shape.layers):
        raise GenomeLMError(f"rehearse {args.experiment}: model.dtype is float32, and without expert parallelism the "
                            "routed experts run torch's grouped matmul (aten._grouped_mm), which takes bfloat16 "
                            "inputs only on fake tensors; rehearse it with --set model.dtype=bfloat16 (or "
                            "parallel.ep > 1)")
    plan = make_plan(shape, layout, cluster, assumptions)
    layers = None if args.layers is None else cfg_layers(args.layers, shape.n_layers)
    result = rehearse(cfg, args.gpus, args.gpu, args.routing, layers, args.steps, args.experiment, plan=plan)
    print(format_rehearsal(result))


def experiment_for(args: RehearseParams):
    """The experiment as the rehearsal runs it: `--set` applied, dp resolved for --gpus (as `plan` does)."""
    from genome_lm.config import load_experiment

    cfg = load_experiment(args.experiment, list(args.overrides))
    if args.gpus % cfg.parallel.cp:
        raise GenomeLMError(f"--gpus {args.gpus}: parallel.cp={cfg.parallel.cp} of {args.experiment} does not divide "
                            "it; give a multiple of it")
    cfg.parallel.dp = "auto"
    return cfg


def cfg_layers(layers: int | str, total: int) -> int:
    return total if layers == "all" else int(layers)
