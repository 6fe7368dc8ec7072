"""The leader lease: the fence's deadline, the elector's campaign and hold over a scriptable
lease, and the PostgreSQL lease itself (take, renew, expire, release) on a real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.postgres import LocalPostgres
from tests.unit.scheduler.fakes import ManualClock
from truba.scheduler.election import Elector
from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.lease import Fence, LeaseRow
from truba.scheduler.lease_postgres import PostgresLease
from truba.scheduler.store_postgres import PostgresJobStore


def test_the_fence_ends_a_ttl_less_the_margin_after_the_renew_was_sent() -> None:
    clock = ManualClock(100.0)
    fence = Fence(3.0, clock=clock)
    assert not fence.leading() and fence.margin == pytest.approx(0.45)
    # A renew sent at 100 counts from 100, however late its answer came
    fence.renewed(100.0)
    clock.advance(2.5)
    assert fence.leading()
    clock.advance(0.1)
    assert not fence.leading(), "it must stop before 100 + ttl, when the database may hand over"
    # An older renew's answer arriving late never moves the deadline back
    fence.renewed(99.0)
    assert fence.deadline == pytest.approx(102.55)


def test_a_fence_that_lost_never_leads_again() -> None:
    clock = ManualClock(0.0)
    fence = Fence(3.0, clock=clock)
    fence.renewed(0.0)
    fence.lose()
    fence.renewed(1.0)
    assert not fence.leading() and fence.deadline == float("-inf")


def test_a_ttl_too_short_for_its_margin_is_refused() -> None:
    with pytest.raises(ValueError, match="lease ttl"):
        Fence(0.3)


class ScriptedLease:
    """A LeaseStore whose answers the test scripts: grant, refuse (another holds), fail."""

    def __init__(self) -> None:
        self.mode = "grant"
        self.epoch = 0
        self.calls = 0
        self.released: list[str] = []

    def acquire(self, holder: str, address: str, ttl: float) -> LeaseRow:
        self.calls += 1
        if self.mode == "fail":
            raise StoreUnavailable("the lease failed: no route")
        if self.mode == "hang":
            time.sleep(1.0)
            raise StoreUnavailable("the lease failed: timeout")
        if self.mode == "other":
            return LeaseRow("someone-else", "b:50051", self.epoch + 1, time.time() + ttl)
        if self.epoch == 0:
            self.epoch = 7
        return LeaseRow(holder, address, self.epoch, time.time() + ttl)

    def release(self, holder: str) -> None:
        self.released.append(holder)

    def close(self) -> None:
        pass


async def test_a_standby_campaigns_until_the_lease_is_free_and_names_the_leader_meanwhile() -> None:
    lease = ScriptedLease()
    lease.mode = "other"
    elector = Elector(lease, address="a:50051", ttl=0.9, poll=0.01)
    campaign = asyncio.create_task(elector.campaign())
    await asyncio.sleep(0.05)
    assert not campaign.done()
    assert elector.leader_address() == "b:50051" and not elector.fence.leading()
    lease.mode = "grant"
    assert await asyncio.wait_for(campaign, 1.0) == 7
    assert elector.fence.leading() and elector.leader_address() == "a:50051"


@pytest.mark.parametrize("mode", ["fail", "hang"])
async def test_a_leader_whose_renews_fail_stops_before_its_last_renew_plus_the_ttl(mode: str) -> None:
    lease = ScriptedLease()
    elector = Elector(lease, address="a:50051", ttl=0.9, poll=0.01)
    sent = time.monotonic()
    assert await elector.try_once() == 7
    holding = asyncio.create_task(elector.hold())
    await asyncio.sleep(0.5)
    assert elector.fence.leading() and lease.calls >= 2, "it renews every third of the ttl"
    last_sent = time.monotonic()  # the last renew that can succeed was sent before this
    deadline = elector.fence.deadline
    lease.mode = mode
    await asyncio.wait_for(holding, 2.0)
    assert not elector.fence.leading() and elector.fence.lost
    assert sent < deadline < last_sent + 0.9, "it leads no longer than the database lets it"


async def test_a_leader_that_finds_another_holder_stops_at_once() -> None:
    lease = ScriptedLease()
    elector = Elector(lease, address="a:50051", ttl=0.9, poll=0.01)
    await elector.try_once()
    holding = asyncio.create_task(elector.hold())
    lease.mode = "other"
    await asyncio.wait_for(holding, 1.0)
    assert elector.fence.lost and lease.calls == 2


async def test_the_watchdog_steps_down_even_when_the_event_loop_is_blocked() -> None:
    lease = ScriptedLease()
    elector = Elector(lease, address="a:50051", ttl=0.9)
    await elector.try_once()
    stepped: list[float] = []
    done = elector.watchdog(lambda: stepped.append(time.monotonic()))
    try:
        time.sleep(1.0)  # blocks the loop: no renew, no timer runs
        assert stepped and stepped[0] < elector.fence.clock() and elector.fence.lost
    finally:
        done.set()


@pytest.fixture
def lease_url(postgres_server: LocalPostgres) -> Iterator[str]:
    url = postgres_server.create_database()
    PostgresJobStore(url).close()  # applies the schema steps (the lease's table is step 5)
    yield url


def test_the_postgresql_lease_is_taken_renewed_expired_and_released(lease_url: str) -> None:
    a = PostgresLease(lease_url, timeout=1.0)
    b = PostgresLease(lease_url, timeout=1.0)
    try:
        first = a.acquire("a", "a:50051", 0.5)
        assert (first.holder, first.address) == ("a", "a:50051")
        # Renewing keeps the epoch; another holder cannot take it while it lasts
        assert a.acquire("a", "a:50051", 0.5).epoch == first.epoch
        refused = b.acquire("b", "b:50051", 0.5)
        assert (refused.holder, refused.address, refused.epoch) == ("a", "a:50051", first.epoch)
        assert refused.expires_at > time.time()
        # Once it expired (by the database's clock), the other takes it with the next epoch
        time.sleep(0.6)
        taken = b.acquire("b", "b:50051", 0.5)
        assert (taken.holder, taken.epoch) == ("b", first.epoch + 1)
        # And the former holder's renew fails: the row is the other's
        assert a.acquire("a", "a:50051", 0.5).holder == "b"
        # A release lets a standby take it at once
        b.release("b")
        assert a.acquire("a", "a:50051", 10.0).epoch == first.epoch + 2
        a.release("not-the-holder")
        assert b.acquire("b", "b:50051", 0.5).holder == "a"
    finally:
        a.close()
        b.close()


def test_a_lease_on_an_unreachable_database_fails_typed_and_bounded() -> None:
    from truba.local import free_port

    lease = PostgresLease(f"postgresql://truba@127.0.0.1:{free_port()}/x", timeout=0.5)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="the lease in postgresql://truba@127.0.0.1"):
        lease.acquire("a", "a:1", 3.0)
    assert time.monotonic() - started < 3.0


def test_every_start_of_a_lone_scheduler_takes_the_next_epoch(lease_url: str, tmp_path: object) -> None:
    store = PostgresJobStore(lease_url)
    try:
        first = store.claim_epoch("a:1")
        assert store.claim_epoch("a:1") == first + 1
    finally:
        store.close()


def test_a_store_fenced_by_its_lease_writes_nothing_once_another_leads(lease_url: str) -> None:
    lease = PostgresLease(lease_url, timeout=1.0)
    store = PostgresJobStore(lease_url)
    try:
        mine = lease.acquire("a", "a:1", 0.3)
        store.fence_writes("a", mine.epoch)
        store.reserve("job-1")  # leading: writes go through
        assert store.stale() == ["job-1"]
        time.sleep(0.4)
        assert lease.acquire("b", "b:1", 10.0).holder == "b"
        # When another leads, a write of the former leader fails and changes nothing
        with pytest.raises(StoreUnavailable, match="no longer leads"):
            store.reserve("job-2")
        assert store.stale() == ["job-1"]
    finally:
        store.close()
        lease.close()
