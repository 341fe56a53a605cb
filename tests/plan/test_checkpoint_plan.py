"""The planner's checkpoint: size, training stall and write time at the stated filesystem bandwidth,
and the pinned host memory of async staging, counted with offload's in the host memory check."""

from __future__ import annotations

import json

import pytest

from genome_lm.cli import main
from genome_lm.plan.hardware import GiB

EXP_1M = "experiments/glm53flash_1m_64xb200.yaml"


def plan(capsys, *extra) -> dict:
    assert main(["plan", EXP_1M, "--gpus", "64", "--json", *extra]) in (0, 2)
    return json.loads(capsys.readouterr().out)


def test_reference_layout_checkpoint_stall_and_staging(capsys):
    """1M on 64 B200 (bf16 AdamW moments): 8 bytes of train_state per parameter over 64 shards;
    async stalls for the copy over the host link, sync for the whole write at 10 GB/s; staging and
    offload together still fit the node's usable host memory."""
    p = plan(capsys)
    ck, params = p["checkpoint"], p["model"]["parameters"]["total"]
    assert ck["train_state_bytes"] == 8 * params and ck["state_bytes_per_gpu"] == 8 * params // 64
    assert ck["staging_host_bytes_per_gpu"] == ck["state_bytes_per_gpu"]
    assert ck["write_s"] == pytest.approx(ck["train_state_bytes"] / 10e9)
    assert ck["stall_s"] < 2 < 200 < ck["write_s"]
    staging_node = 8 * ck["staging_host_bytes_per_gpu"]
    assert p["fits"] and 8 * p["host_bytes_per_gpu"] + staging_node <= 0.9 * 2048 * GiB
    sync = plan(capsys, "--assume", "checkpoint_async=false", "--assume", "checkpoint_write_gbps=20")
    assert sync["checkpoint"]["staging_host_bytes_per_gpu"] == 0
    assert sync["checkpoint"]["stall_s"] == pytest.approx(ck["train_state_bytes"] / 20e9)


def test_a_sync_experiment_is_planned_without_staging(capsys):
    """train.checkpoint_mode: sync in the experiment: no staging, the whole write is the stall;
    --assume checkpoint_async=true still overrides it."""
    sync = plan(capsys, "--set", "train.checkpoint_mode=sync")["checkpoint"]
    assert not sync["asynchronous"] and sync["staging_host_bytes_per_gpu"] == 0
    assert sync["stall_s"] == pytest.approx(sync["write_s"])
    forced = plan(capsys, "--set", "train.checkpoint_mode=sync", "--assume", "checkpoint_async=true")["checkpoint"]
    assert forced["asynchronous"] and forced["staging_host_bytes_per_gpu"] == forced["state_bytes_per_gpu"]


def test_staging_counts_in_the_host_memory_check(capsys):
    """On nodes with 1,840 GiB of host memory, offload alone fits (1,409 GiB of 1,656 usable) but not
    with the staged checkpoint: the verdict names the staging."""
    p = plan(capsys, "--host-mem", "1840GiB")
    assert not p["fits"]
    assert any("of async checkpoint staging" in x for x in p["problems"])
    assert plan(capsys, "--host-mem", "1840GiB", "--assume", "checkpoint_async=false")["fits"]


def test_report_prints_the_checkpoint(capsys):
    assert main(["plan", EXP_1M, "--gpus", "64"]) == 0
    out = capsys.readouterr().out
    assert "host memory (pinned, async checkpoint staging): 36.5 GiB per GPU" in out
    assert "training stalls 0.8 s per checkpoint, the write takes 251 s at 10 GB/s" in out
