"""The daemon's reconciliation, preemption, drain and heartbeats, over fake pipes and real slots."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from tests.unit.daemon.copies import uncopied
from tests.waiting import eventually
from truba.daemon import daemon as daemon_module
from truba.daemon.daemon import Daemon, DaemonConfig
from truba.daemon.job_pipes import JobPipes, Wanted
from truba.pipes.frame import pack, unpack
from truba.pipes.prefetch import Window
from truba.pipes.testing import FakeBroker, FakeListener, FakeSender
from truba.proto.v1 import common_pb2, daemons_pb2
from truba.queues import job_queues
from truba.wire import GaveUpRecord, ResultCodec, ResultMessage, TaskCodec, TaskMessage


@dataclass
class FakeJob:
    tasks: FakeListener[TaskMessage]
    results: FakeSender[ResultMessage]
    requeue: FakeSender[TaskMessage]
    dead: FakeSender[GaveUpRecord]


class FakePipesDaemon(Daemon):
    """A daemon whose jobs' pipes are in-memory fakes, one set per job kept across reopenings."""

    def __init__(self, config: DaemonConfig) -> None:
        super().__init__(config)
        self.jobs: dict[str, FakeJob] = {}

    def _open_pipes(self, job_id: str, job: Wanted, window: Window) -> JobPipes:
        tasks_queue = job.tasks_queue if isinstance(job.tasks_queue, str) else job.tasks_queue.name
        fake = self.jobs.get(tasks_queue)
        if fake is None or fake.tasks.closed:
            old = fake
            fake = FakeJob(FakeListener(), FakeSender(True), FakeSender(True), FakeSender(True))
            if old is not None:  # what was left in the old listener is still the job's
                fake.results.sent, fake.requeue.sent = old.results.sent, old.requeue.sent
            self.jobs[tasks_queue] = fake
        return JobPipes(fake.tasks, fake.results, fake.requeue, fake.dead)


def job_slots(
    job_id: str, handler: str, slots: int, *, immediate: bool = False, grace: float = 0.0
) -> daemons_pb2.JobSlots:
    preemption = common_pb2.PREEMPTION_IMMEDIATE if immediate else common_pb2.PREEMPTION_GRACEFUL
    return daemons_pb2.JobSlots(
        job_id=job_id,
        handler=handler,
        slots=slots,
        queues=common_pb2.JobQueues(tasks=job_id, results=f"{job_id}.r", dead=f"{job_id}.d"),
        settings=common_pb2.JobSettings(preemption=preemption, preemption_grace=grace),
    )


@pytest.fixture
async def daemon() -> AsyncIterator[Callable[[int], FakePipesDaemon]]:
    running: list[tuple[FakePipesDaemon, asyncio.Task[None]]] = []

    def start(slots: int) -> FakePipesDaemon:
        config = DaemonConfig("127.0.0.1:1", slots, ["tests.handlers.*"], daemon_id="d-test")
        made = FakePipesDaemon(config)
        made.welcome(daemons_pb2.Welcome(brokers=[common_pb2.Broker(url="amqp://127.0.0.1:1/", name="b0")]))
        running.append((made, asyncio.create_task(made.run())))
        return made

    yield start
    for made, task in running:
        made.stop_now()
        await asyncio.wait_for(task, 20)


def assign(d: Daemon, version: int, *jobs: daemons_pb2.JobSlots) -> None:
    d.assign(daemons_pb2.Assignment(version=version, jobs=list(jobs)))


async def test_immediate_preemption_starts_the_new_jobs_task_within_a_second(
    daemon: Callable[[int], FakePipesDaemon],
) -> None:
    d = daemon(1)
    assign(d, 1, job_slots("a", "tests.handlers.basic:sleep", 1, immediate=True))
    await eventually(lambda: "a" in d.jobs)
    d.jobs["a"].tasks.push(TaskMessage("long", 60))
    await eventually(lambda: d.heartbeat().stats and d.heartbeat().stats[0].busy_slots == 1)
    assign(d, 2, job_slots("b", "tests.handlers.faults:stamp", 1))
    reassigned = time.time()
    await eventually(lambda: "b" in d.jobs)
    d.jobs["b"].tasks.push(TaskMessage("first", 1.5))
    await eventually(lambda: d.jobs["b"].results.sent)
    began = d.jobs["b"].results.sent[0].value["began"]  # type: ignore[index]
    assert began - reassigned < 1.0, f"the new job's task started {began - reassigned:.2f} s after"
    # The interrupted task went back to its queue unspent, acked once that was confirmed.
    a = d.jobs["a"]
    assert uncopied(a.requeue.sent) == [TaskMessage("long", 60)] and a.results.sent == []
    await eventually(lambda: a.tasks.acked == [TaskMessage("long", 60)])
    await eventually(lambda: a.tasks.closed)  # its consumer is gone


async def test_a_graceful_jobs_grace_bounds_how_long_a_taken_slot_keeps_its_task(
    daemon: Callable[[int], FakePipesDaemon],
) -> None:
    d = daemon(2)
    assign(d, 1, job_slots("a", "tests.handlers.basic:sleep", 2, grace=1.0))
    await eventually(lambda: "a" in d.jobs)
    d.jobs["a"].tasks.push(TaskMessage("long", 60))
    d.jobs["a"].tasks.push(TaskMessage("short", 0.3))
    await eventually(lambda: d.heartbeat().stats and d.heartbeat().stats[0].busy_slots == 2)
    assign(
        d,
        2,
        job_slots("a", "tests.handlers.basic:sleep", 0, grace=1.0),
        job_slots("b", "tests.handlers.faults:stamp", 2),
    )
    taken = time.time()
    await eventually(lambda: "b" in d.jobs)
    d.jobs["b"].tasks.push(TaskMessage("first", 1.5))
    d.jobs["b"].tasks.push(TaskMessage("second", 1.5))
    await eventually(lambda: len(d.jobs["b"].results.sent) == 2, timeout=10)
    began = sorted(r.value["began"] for r in d.jobs["b"].results.sent)  # type: ignore[index]
    # The short task ended within the grace and its slot moved then; the long one was
    # interrupted when the grace was over, went back unspent, and its slot moved.
    assert began[0] - taken < 0.9, f"the freed slot served b {began[0] - taken:.2f} s after"
    assert 0.95 < began[1] - taken < 3.0, f"the second slot served b {began[1] - taken:.2f} s after"
    a = d.jobs["a"]
    assert [r.task_id for r in a.results.sent] == ["short"]
    assert uncopied(a.requeue.sent) == [TaskMessage("long", 60)]


async def test_heartbeats_carry_cumulative_stats_and_drain_finishes_running_tasks(
    daemon: Callable[[int], FakePipesDaemon],
) -> None:
    d = daemon(2)
    assign(d, 7, job_slots("j", "tests.handlers.basic:square", 2))
    await eventually(lambda: "j" in d.jobs)
    for i in range(5):
        d.jobs["j"].tasks.push(TaskMessage(f"t{i}", i if i != 3 else -1))
    await eventually(lambda: len(d.jobs["j"].tasks.acked) == 5)
    [stats] = d.heartbeat().stats
    assert (stats.job_id, stats.done, stats.failed, stats.busy_slots) == ("j", 4, 1, 0)
    assert stats.service_time > 0 and stats.waiting == 0
    assert d.heartbeat().applied_version == 7 and not d.heartbeat().draining
    # The job leaves and comes back: its counters go on from where they were.
    assign(d, 8)
    await eventually(lambda: d.jobs["j"].tasks.closed)
    assign(d, 9, job_slots("j", "tests.handlers.basic:sleep", 2))
    await eventually(lambda: not d.jobs["j"].tasks.closed)
    d.jobs["j"].tasks.push(TaskMessage("last", 0.5))
    await eventually(lambda: d.heartbeat().stats[0].busy_slots == 1)
    d.drain("test")
    beat = d.heartbeat()
    assert beat.draining and beat.running[0].slots >= 1
    await eventually(lambda: d.jobs["j"].tasks.closed, timeout=5)
    assert d.jobs["j"].tasks.acked[-1] == TaskMessage("last", 0.5)  # finished, confirmed, acked
    assert d.heartbeat().stats[0].done == 5
    await eventually(lambda: d.heartbeat().running == [])


async def test_a_new_jobs_window_takes_its_extra_once_its_first_task_told_it_is_short(
    daemon: Callable[[int], FakePipesDaemon],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A fresh job's window is its slots (its task length unknown); the first task's end tells
    # the daemon at once, not at a reconciliation that nothing else calls for (here: never).
    monkeypatch.setattr(daemon_module, "RECONCILE_EVERY", 60.0)
    d = daemon(2)
    assign(d, 1, job_slots("j", "tests.handlers.basic:square", 2))
    await eventually(lambda: "j" in d.jobs)
    runner = d._runners["j"]
    assert runner.window.size == 2
    d.jobs["j"].tasks.push(TaskMessage("t0", 3))
    await eventually(lambda: len(d.jobs["j"].tasks.acked) == 1)
    await eventually(lambda: runner.window.size == 2 + d.config.prefetch_extra, timeout=2.0)
    # The job leaves: its runner closes as before, its counters logged (the hook is no counter).
    with caplog.at_level(logging.INFO, logger="truba.daemon.runner"):
        assign(d, 2)
        await eventually(lambda: d.jobs["j"].tasks.closed)
        await eventually(lambda: any(r.msg == "daemon.job.closed" for r in caplog.records))


async def test_a_drain_with_nothing_running_is_immediate_and_a_second_stop_interrupts(
    daemon: Callable[[int], FakePipesDaemon],
) -> None:
    idle = daemon(1)
    assign(idle, 1, job_slots("j", "tests.handlers.basic:echo", 1))
    await eventually(lambda: "j" in idle.jobs)
    began = time.monotonic()
    idle.drain("test")
    await eventually(lambda: idle._stop.is_set(), timeout=5)
    assert time.monotonic() - began < 1.5

    busy = daemon(1)
    assign(busy, 1, job_slots("k", "tests.handlers.basic:sleep", 1))
    await eventually(lambda: "k" in busy.jobs)
    busy.jobs["k"].tasks.push(TaskMessage("long", 60))
    await eventually(lambda: busy.heartbeat().stats and busy.heartbeat().stats[0].busy_slots == 1)
    busy.drain("test")
    await asyncio.sleep(0.3)
    assert not busy._stop.is_set()  # draining waits for the task
    began = time.monotonic()
    busy.stop_now()
    await eventually(lambda: busy._stop.is_set(), timeout=5)
    assert time.monotonic() - began < 1.5
    assert uncopied(busy.jobs["k"].requeue.sent) == [TaskMessage("long", 60)]
    assert busy.jobs["k"].tasks.acked == [TaskMessage("long", 60)]


async def test_refused_handlers_are_not_run(daemon: Callable[[int], FakePipesDaemon]) -> None:
    d = daemon(1)
    assign(d, 1, job_slots("x", "os:system", 1), job_slots("y", "tests.handlers.basic:echo", 1))
    await eventually(lambda: "y" in d.jobs)
    assert "x" not in d.jobs


async def test_a_daemon_over_a_fake_broker_runs_a_task_end_to_end_through_its_real_stacks() -> None:
    # The injection point: the daemon's own pipes (frames, result log, dead letters) over FakeBroker.
    broker = FakeBroker("fake://b0")
    queues = job_queues("fk")
    for spec in queues.specs():
        await broker.declare(spec)
    config = DaemonConfig("127.0.0.1:1", 1, ["tests.handlers.*"], daemon_id="d-fake")
    opened: list[str] = []

    def brokers(url: str) -> FakeBroker:
        opened.append(url)
        return broker

    made = Daemon(config, brokers=brokers)
    made.welcome(daemons_pb2.Welcome(brokers=[common_pb2.Broker(url="fake://b0", name="b0")]))
    running = asyncio.create_task(made.run())
    try:
        wire = common_pb2.JobQueues(tasks=queues.tasks, results=queues.results, dead=queues.dead)
        made.assign(
            daemons_pb2.Assignment(
                version=1,
                jobs=[
                    daemons_pb2.JobSlots(
                        job_id="fk", handler="tests.handlers.basic:square", slots=1, queues=wire
                    )
                ],
            )
        )
        publisher = await broker.sender(queues.tasks)
        await (await publisher.send(TaskCodec().encode(TaskMessage("t1", 7))))
        await eventually(lambda: broker.messages(queues.results), timeout=20)
        [result] = [ResultCodec().decode(body) for body in broker.messages(queues.results)]
        assert (result.task_id, result.ok, result.value) == ("t1", True, 49)
        await eventually(lambda: broker.messages(queues.tasks) == [])  # acked once the result was confirmed
        assert opened == ["fake://b0"]
        # A task delivered alone: its result skips the result log (read for redelivered frames only)
        assert broker.messages(queues.result_log) == []
        # The members of a frame: their results are copied into the log, in the same confirm
        framed = [TaskCodec().encode(TaskMessage(f"m{i}", i)) for i in range(3)]
        await (await publisher.send(pack(framed)))
        await eventually(lambda: len(_results(broker.messages(queues.results))) == 4, timeout=20)
        logged = broker.messages(queues.result_log)
        assert sorted(r.task_id for r in _results(logged)) == ["m0", "m1", "m2"]
        assert all(body in broker.messages(queues.results) for body in logged)
    finally:
        made.stop_now()
        await asyncio.wait_for(running, 20)


async def test_heartbeats_list_the_attempts_in_progress_until_they_end(
    daemon: Callable[[int], FakePipesDaemon],
) -> None:
    d = daemon(2)
    assign(d, 1, job_slots("j", "tests.handlers.basic:sleep", 2, immediate=True))
    await eventually(lambda: "j" in d.jobs)
    d.jobs["j"].tasks.push(TaskMessage("long", 60))
    d.jobs["j"].tasks.push(TaskMessage("short", 0.0))
    await eventually(lambda: len(d.jobs["j"].tasks.acked) == 1)
    await eventually(lambda: [a.task_id for a in d.heartbeat().attempts] == ["long"])
    beat = d.heartbeat()
    [attempt] = beat.attempts
    assert (attempt.job_id, attempt.attempt) == ("j", 1) and attempt.slot in (0, 1)
    assert 0 < time.time() - attempt.start < 10 and dict(beat.attempts_left_out) == {}
    assign(d, 2)  # the job leaves at once: its attempt is interrupted
    await eventually(lambda: not d.heartbeat().attempts)


def _results(bodies: list[bytes]) -> list[ResultMessage]:
    """The results in ``bodies``, each a result or a frame of them."""
    codec = ResultCodec()
    return [codec.decode(member) for body in bodies for member in (unpack(body) or [body])]
