from __future__ import annotations

import gc
import logging
import time

import pytest

from truba.scheduler.gc_watch import THRESHOLDS, GcWatch


def test_the_thresholds_are_set_while_installed_and_restored_after() -> None:
    before = gc.get_threshold()
    watch = GcWatch()
    watch.install()
    try:
        assert gc.get_threshold() == THRESHOLDS
        gc.collect(0)
        assert watch.passes[0] >= 1 and watch.seconds[0] >= 0.0
    finally:
        watch.remove()
    assert gc.get_threshold() == before
    watch.remove()  # idempotent
    assert gc.get_threshold() == before


def test_two_watches_in_one_process_restore_the_thresholds_when_the_last_goes() -> None:
    before = gc.get_threshold()
    first, second = GcWatch(), GcWatch()
    first.install()
    second.install()
    first.remove()
    assert gc.get_threshold() == THRESHOLDS  # the second scheduler still runs
    second.remove()
    assert gc.get_threshold() == before


def test_a_slow_pass_is_logged_with_its_generation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    times = iter([10.0, 10.3, 20.0, 20.001])
    monkeypatch.setattr(time, "perf_counter", lambda: next(times))
    watch = GcWatch()
    with caplog.at_level(logging.INFO, logger="truba.scheduler.gc_watch"):
        watch._callback("start", {"generation": 2})
        watch._callback("stop", {"generation": 2, "collected": 7})
        watch._callback("start", {"generation": 0})
        watch._callback("stop", {"generation": 0, "collected": 0})
    [record] = [r for r in caplog.records if r.getMessage() == "sched.gc.slow"]
    assert (record.__dict__["generation"], record.__dict__["ms"], record.__dict__["collected"]) == (
        2,
        300.0,
        7,
    )
    assert watch.passes == [1, 0, 1]
    assert watch.seconds[2] == pytest.approx(0.3)
