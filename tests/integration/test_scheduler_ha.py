"""High availability: two schedulers on one PostgreSQL, a leader and a standby.

- The leader killed with -9 mid-job: the standby leads within 5 s, a watch of the job follows it,
  the job completes with every outcome once, a new job can be created, the daemons (given both
  addresses) follow the new leader and apply its plan.
- The leader cut off from PostgreSQL (its connection goes through a fault proxy, which stalls):
  it stops leading before its lease ends in the database, the standby takes over after that, and
  no assignment of the former leader is applied after the new one leads.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.ha_rig import Schedulers, events, logs, wait_for_line
from tests.integration.processes import ALLOW
from tests.postgres import LocalPostgres
from truba.client import Client
from truba.daemon.control import SchedulerLink
from truba.local.cluster import LocalCluster
from truba.local.proxy_thread import ThreadedFaultProxy
from truba.proto.v1 import daemons_pb2, jobs_pb2

pytestmark = pytest.mark.integration

TASKS = 300
STANDBY_EVENT = '"sched.standby"'


@pytest.fixture(scope="module")
def postgres() -> Iterator[LocalPostgres]:
    server = LocalPostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


async def test_the_leader_killed_mid_job_the_standby_leads_within_5_s_and_nothing_is_lost(
    rabbit_nodes: list[object], tmp_path: Path, postgres: LocalPostgres
) -> None:
    local = LocalCluster(tmp_path)
    schedulers = Schedulers(local, [b.url for b in rabbit_nodes], postgres.create_database())  # type: ignore[attr-defined]
    seen: collections.Counter[str] = collections.Counter()
    try:
        # Given a leader and a standby, two daemons and a client that know both
        first = await asyncio.to_thread(schedulers.start, 0)
        assert await asyncio.to_thread(schedulers.leader) is first
        second = await asyncio.to_thread(schedulers.start, 1)
        await asyncio.to_thread(wait_for_line, second, STANDBY_EVENT)
        local.address = schedulers.address
        for i in range(2):
            local.start_daemon(f"d{i}", 2, ALLOW)
        await asyncio.to_thread(local.wait_for_daemons, 2)
        async with Client(schedulers.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:sleep", importance=1.0)
            for _ in range(TASKS):
                await job.submit(0.02)
            await job.close()
            quarter = asyncio.Event()

            async def consume() -> None:
                async for outcome in job.results():
                    assert outcome.ok, outcome.error
                    seen[outcome.task_id] += 1
                    if sum(seen.values()) >= TASKS // 4:
                        quarter.set()

            consumer = asyncio.create_task(consume())
            states: list[int] = []

            async def watch() -> None:
                async for event in job.watch():
                    states.append(event.job.state)

            watcher = asyncio.create_task(watch())
            await asyncio.wait_for(quarter.wait(), 60)
            # When the leader dies with -9 mid-job
            killed_at = time.time()
            first.kill()
            # Then the standby leads within 5 s
            leader = await asyncio.to_thread(schedulers.leader, 10.0)
            assert leader is second
            (acquired,) = events(second, "sched.lease.acquired")
            assert acquired["at"] - killed_at < 5.0, f"took {acquired['at'] - killed_at:.2f} s"
            (started,) = events(first, "sched.started")
            assert acquired["epoch"] > started["epoch"]
            # And the job completes with every outcome once
            await asyncio.wait_for(consumer, 120)
            info = await client.get_job_info(job.id)
            assert info.state == jobs_pb2.JOB_STATE_FINISHED
            # And a watch opened before the kill follows the new leader to the job's end
            await asyncio.wait_for(watcher, 30)
            assert states[-1] == jobs_pb2.JOB_STATE_FINISHED, states
            # And a new job can be created (the client follows the leader) and runs
            again = await client.create_job("tests.handlers.basic:square", importance=1.0)
            await again.submit(7)
            await again.close()
            assert [o.value async for o in again.results()] == [49]
            # And both daemons follow the new leader: welcomed with its epoch, its plan applied
            # (one may still be waiting out a retry: the new leader's port was closed while it
            # loaded the store, and the job above could finish on the other daemon alone)
            async with asyncio.timeout(10):
                while (await client.cluster_info()).daemons < 2:
                    await asyncio.sleep(0.1)
            for name in ("d0", "d1"):
                daemon = next(p for p in local.processes if p.name == name)
                epochs = [e.get("epoch") for e in events(daemon, "daemon.scheduler.connected")]
                assert acquired["epoch"] in epochs, epochs
    except BaseException:
        print(logs(local))
        raise
    finally:
        await asyncio.to_thread(local.stop)
    assert len(seen) == TASKS, f"{len(seen)} outcomes of {TASKS}"
    assert set(seen.values()) == {1}, "an outcome was delivered twice"


class Recorder:
    """A daemon's side of the link that records each assignment it is handed (the link's epoch
    check runs before): when, the epoch, the version."""

    def __init__(self) -> None:
        self.applied: list[tuple[float, int, int]] = []
        self.link: SchedulerLink | None = None
        self.version = 0

    def hello(self) -> daemons_pb2.Hello:
        return daemons_pb2.Hello(daemon_id="recorder", hostname="test", pid=1, slots=1, allow=ALLOW)

    def heartbeat(self) -> daemons_pb2.Heartbeat:
        epoch = self.link.applied_epoch if self.link is not None else 0
        return daemons_pb2.Heartbeat(applied_version=self.version, applied_epoch=epoch)

    def welcome(self, welcome: daemons_pb2.Welcome) -> None:
        pass

    def assign(self, assignment: daemons_pb2.Assignment) -> None:
        self.applied.append((time.time(), assignment.epoch, assignment.version))
        self.version = assignment.version

    def drain(self, reason: str = "scheduler") -> None:
        pass


async def test_a_leader_cut_off_from_postgresql_stops_leading_before_its_lease_ends(
    rabbit_nodes: list[object], tmp_path: Path, postgres: LocalPostgres
) -> None:
    url = postgres.create_database()
    proxy = ThreadedFaultProxy("127.0.0.1", postgres.port)
    proxy.start()
    local = LocalCluster(tmp_path)
    schedulers = Schedulers(local, [b.url for b in rabbit_nodes], url)  # type: ignore[attr-defined]
    recorder = Recorder()
    stop = asyncio.Event()
    link_task: asyncio.Task[None] | None = None
    try:
        # Given a leader whose PostgreSQL connection goes through the proxy, and a standby
        first = await asyncio.to_thread(
            schedulers.start,
            0,
            "--store-timeout",
            "1",
            store=url.replace(str(postgres.port), str(proxy.port)),
        )
        assert await asyncio.to_thread(schedulers.leader) is first
        second = await asyncio.to_thread(schedulers.start, 1)
        await asyncio.to_thread(wait_for_line, second, STANDBY_EVENT)
        (started,) = events(first, "sched.started")
        # And a daemon's link, given both addresses, that applied the leader's assignment
        link = SchedulerLink(schedulers.address, recorder)
        recorder.link = link
        link_task = asyncio.create_task(link.run(stop))
        await _until(lambda: any(epoch == started["epoch"] for _, epoch, _ in recorder.applied))
        # When the leader's database connection stalls (a partition: nothing passes, no reset)
        proxy.stall()
        # Then it stops leading before its lease ends in the database, and the standby leads
        # only after that
        await asyncio.to_thread(wait_for_line, second, "truba scheduler leading on", 20.0)
        (lost,) = events(first, "sched.lease.lost")
        (acquired,) = events(second, "sched.lease.acquired")
        assert lost["epoch"] == started["epoch"]
        assert lost["at"] < lost["lease_until"] <= acquired["at"], (lost, acquired)
        assert acquired["epoch"] > lost["epoch"]
        # And the daemon follows the new leader; no assignment of the former one is applied
        # after it stopped leading
        await _until(lambda: any(epoch == acquired["epoch"] for _, epoch, _ in recorder.applied))
        late = [
            (at, epoch) for at, epoch, _ in recorder.applied if epoch < acquired["epoch"] and at > lost["at"]
        ]
        assert late == []
        assert link.epoch == acquired["epoch"] and link.applied_epoch == acquired["epoch"]
        # And once the partition heals, the former leader is a standby that sends nothing
        proxy.pass_()
        await asyncio.to_thread(wait_for_line, first, STANDBY_EVENT, 20.0)
        assert first.alive()
        assert max(epoch for _, epoch, _ in recorder.applied) == acquired["epoch"]
    except BaseException:
        print(logs(local))
        raise
    finally:
        stop.set()
        if link_task is not None:
            await asyncio.wait_for(link_task, 10)
        await asyncio.to_thread(local.stop)
        proxy.close()


async def _until(check: object, timeout: float = 20.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.05)
