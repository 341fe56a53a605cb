"""Memory and throughput model: will a run fit, and how fast will it go (`genome-lm plan`, docs/plan.md).
`planner.make_plan` evaluates one layout (`shapes.model_shape`, `layout.Layout`, `hardware.make_cluster`),
`planner.fit` searches them (`--fit`)."""
