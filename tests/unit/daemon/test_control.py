from __future__ import annotations

import random

from truba.backoff import Backoff
from truba.daemon.control import RECONNECT_BACKOFF, SchedulerLink
from truba.proto.v1 import daemons_pb2


def test_backoff_is_full_jitter_bounded_by_the_cap() -> None:
    assert (RECONNECT_BACKOFF.base, RECONNECT_BACKOFF.cap, RECONNECT_BACKOFF.attempts) == (0.2, 10.0, None)
    backoff = Backoff(base=0.2, cap=10.0, rng=random.Random(7).uniform)
    delays = [backoff.delay(attempt) for attempt in range(12) for _ in range(20)]
    assert all(0.0 <= d <= 10.0 for d in delays)
    assert max(backoff.delay(0) for _ in range(100)) <= 0.2
    # Jitter: repeated attempts at the same level do not all wait the same time.
    assert len({round(backoff.delay(5), 6) for _ in range(20)}) > 10


def test_backoff_grows_until_the_cap() -> None:
    upper = Backoff(base=0.2, cap=10.0, rng=lambda lo, hi: hi)
    assert [upper.delay(a) for a in range(8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]


class _Daemon:
    """An Assignee that records what it was given."""

    def __init__(self) -> None:
        self.assignments: list[int] = []

    def hello(self) -> daemons_pb2.Hello:
        return daemons_pb2.Hello()

    def heartbeat(self) -> daemons_pb2.Heartbeat:
        return daemons_pb2.Heartbeat()

    def welcome(self, welcome: daemons_pb2.Welcome) -> None:
        pass

    def assign(self, assignment: daemons_pb2.Assignment) -> None:
        self.assignments.append(assignment.version)

    def drain(self, reason: str = "scheduler") -> None:
        pass


async def test_the_heartbeat_interval_follows_welcome_then_assignments_that_carry_one() -> None:
    daemon = _Daemon()
    link = SchedulerLink("127.0.0.1:1", daemon)
    link._handle(daemons_pb2.SchedulerMessage(welcome=daemons_pb2.Welcome(heartbeat_interval=1.0)))
    assert link._heartbeat_interval == 1.0
    # An assignment without one leaves it; one with one (a large cluster's scheduler) sets it
    link._handle(daemons_pb2.SchedulerMessage(assignment=daemons_pb2.Assignment(version=5)))
    assert link._heartbeat_interval == 1.0
    stretched = daemons_pb2.Assignment(version=6, heartbeat_interval=5.0)
    link._handle(daemons_pb2.SchedulerMessage(assignment=stretched))
    assert link._heartbeat_interval == 5.0 and daemon.assignments == [5, 6]
