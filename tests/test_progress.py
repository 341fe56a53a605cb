"""Progress off a terminal: log lines at most once per interval, with the time left estimated from
the work done in this process; nothing when disabled."""

import logging

from genome_lm.progress import ProgressLog, minutes, progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_lines_come_once_per_interval_with_an_estimate_from_this_process(caplog):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="genome_lm.progress")
    bar = ProgressLog(total=100, initial=20, desc="train x", unit="step", every_s=60, clock=clock)
    for _ in range(10):  # 10 steps of 10 s: one line, at the 60 s mark
        clock.t += 10
        bar.update(1)
        bar.set_postfix(loss="1.2345")
    lines = [r.getMessage() for r in caplog.records]
    # at 60 s, 6 steps done since the resumed 20: 10 s each, 74 left -> 740 s
    assert lines == ["train x: 26/100 step (26%), 1.0 min so far, about 12.3 min left; loss 1.2345"]
    bar.close()
    assert caplog.records[-1].getMessage() == ("train x: 30/100 step (30%), 1.7 min so far, about 11.7 min left; "
                                               "loss 1.2345")
    bar.close()
    assert len(caplog.records) == 2  # closed once


def test_minutes_and_disabled_progress(caplog):
    assert [minutes(s) for s in (42, 192, 7200)] == ["42 s", "3.2 min", "2.0 h"]
    caplog.set_level(logging.INFO, logger="genome_lm.progress")
    with progress(10, desc="quiet", disable=True) as bar:
        bar.update(10)
    with progress(10, desc="logged") as bar:  # pytest's stderr is no terminal: log lines
        bar.update(10)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["logged"]


def test_the_last_unit_is_logged_once_at_close(caplog):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="genome_lm.progress")
    bar = ProgressLog(total=2, desc="train y", unit="step", every_s=60, clock=clock)
    for loss in ("2.8141", "2.8112"):
        clock.t += 70  # each step longer than the interval
        bar.update(1)
        bar.set_postfix(loss=loss)
    bar.close()
    assert [r.getMessage() for r in caplog.records] == [
        "train y: 1/2 step (50%), 1.2 min so far, about 1.2 min left",
        "train y: 2/2 step (100%), 2.3 min so far; loss 2.8112"]
