"""The suite runs on CPU: CUDA is hidden before torch is imported, so the trainer, meshes and eval
pick the CPU and gloo on a GPU machine as they do here. The `gpu` tier (`make test-gpu`:
GENOME_LM_TEST_GPU=1, `-m gpu`) keeps CUDA visible; its tests skip without a GPU."""

import os

if os.environ.get("GENOME_LM_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
