from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest

from tests.unit.scheduler.fakes import ManualClock
from tests.unit.scheduler.test_assigner import Jobs, session
from truba.scheduler.assigner import Assigner
from truba.scheduler.gc_pause import GcPause
from truba.scheduler.registry import DaemonRegistry


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Each test starts and ends with nothing frozen and the collector on."""
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_no_collection_runs_in_the_block_and_what_it_left_alive_is_frozen() -> None:
    pause = GcPause()
    with pause:
        assert not gc.isenabled()
        kept = [Node() for _ in range(10)]
    assert gc.isenabled()
    assert pause.frozen == 1
    assert gc.get_freeze_count() > len(kept)


def test_a_collector_that_was_off_stays_off_and_a_nested_block_freezes_once() -> None:
    pause = GcPause()
    gc.disable()
    with pause:
        with pause:
            pass
        assert pause.frozen == 0
    assert pause.frozen == 1
    assert not gc.isenabled()


def test_thaw_collects_the_cycles_that_died_frozen(caplog: pytest.LogCaptureFixture) -> None:
    pause = GcPause()
    with pause:
        garbage = cycle()
    del garbage  # unreachable, but frozen: no pass sees it
    assert gc.collect() == 0
    with caplog.at_level(logging.INFO, logger="truba.scheduler.gc_pause"):
        collected = pause.thaw()
    assert collected >= 2
    assert gc.get_freeze_count() == 0
    [record] = [r for r in caplog.records if r.getMessage() == "sched.gc.thawed"]
    assert record.__dict__["collected"] == collected


def test_each_plan_runs_inside_the_assigners_pause(clock: ManualClock) -> None:
    jobs = Jobs()
    pause = GcPause()
    assigner = Assigner(
        DaemonRegistry(), jobs, heartbeat_interval=1.0, clock=clock, event_delay=0, gc_pause=pause
    )
    jobs.add("j1")
    assigner.connect(session(clock))
    assert pause.frozen == 1
    assert assigner.slots_of("j1") == 4
    assigner.replan()
    assert pause.frozen == 2
    assert gc.isenabled()
