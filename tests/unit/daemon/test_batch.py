"""Batch handlers on one daemon: the collector, and the runner over fake pipes and real slots."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from tests.unit.daemon.copies import uncopied
from tests.waiting import eventually
from truba.daemon.batching import collect
from truba.daemon.job_pipes import JobPipes
from truba.daemon.runner import JobRunner
from truba.daemon.settings import JobSettings
from truba.daemon.slot_process import SlotProcess
from truba.handlers import BatchSpec
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import GaveUpRecord, ResultMessage, TaskMessage

H = "tests.handlers.batching"


# -- the collector ------------------------------------------------------------------------------


async def test_collect_stops_at_max_size_and_leaves_the_rest() -> None:
    tasks: FakeListener[TaskMessage] = FakeListener()
    for i in range(5):
        tasks.push(TaskMessage(f"t{i}", i))
    first = await tasks.get(1.0)
    assert first is not None
    began = time.monotonic()
    batch = await collect(tasks, first, BatchSpec(3, 10.0))
    assert [d.message.task_id for d in batch] == ["t0", "t1", "t2"]
    assert time.monotonic() - began < 0.5  # full: no waiting for max_wait
    rest = await tasks.get(0.0)
    assert rest is not None and rest.message.task_id == "t3"


async def test_collect_waits_at_most_max_wait_and_takes_what_arrives_meanwhile() -> None:
    tasks: FakeListener[TaskMessage] = FakeListener()
    tasks.push(TaskMessage("t0", 0))
    first = await tasks.get(1.0)
    assert first is not None
    asyncio.get_running_loop().call_later(0.05, tasks.push, TaskMessage("late", 1))
    began = time.monotonic()
    batch = await collect(tasks, first, BatchSpec(10, 0.2))
    elapsed = time.monotonic() - began
    assert [d.message.task_id for d in batch] == ["t0", "late"]
    assert 0.15 < elapsed < 0.5


async def test_collect_stops_early_when_asked() -> None:
    tasks: FakeListener[TaskMessage] = FakeListener()
    for i in range(3):
        tasks.push(TaskMessage(f"t{i}", i))
    first = await tasks.get(1.0)
    assert first is not None
    assert len(await collect(tasks, first, BatchSpec(10, 5.0), stop=lambda: True)) == 1


# -- the runner ---------------------------------------------------------------------------------


@dataclass
class Rig:
    runner: JobRunner
    tasks: FakeListener[TaskMessage]
    results: FakeSender[ResultMessage]
    requeue: FakeSender[TaskMessage]
    slots: list[SlotProcess]
    released: list[SlotProcess]

    def outcomes(self) -> dict[str, ResultMessage]:
        return {r.task_id: r for r in self.results.sent}


@pytest.fixture
async def rig() -> AsyncIterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(handler: str, *, target: int = 1, settings: JobSettings | None = None) -> Rig:
        tasks: FakeListener[TaskMessage] = FakeListener()
        results: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
        requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
        dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
        released: list[SlotProcess] = []
        runner = JobRunner(
            "j1", handler, "d1", JobPipes(tasks, results, requeue, dead), released.append,
            target=target, settings=settings,
        )  # fmt: skip
        slots = [SlotProcess(i) for i in range(target)]
        made.append(Rig(runner, tasks, results, requeue, slots, released))
        for slot in slots:
            runner.add_worker(slot)
        return made[-1]

    yield make
    for made_rig in made:
        made_rig.runner.stop_now()
        await made_rig.runner.close()
        for slot in made_rig.slots:
            await slot.stop()


async def test_a_batch_handler_gets_many_tasks_per_call_and_each_task_its_own_outcome(
    rig: Callable[..., Rig],
) -> None:
    r = rig(f"{H}:double_all", target=2)
    await eventually(lambda: r.runner.per_slot == 16)
    assert r.runner.window.size == 2 * 16  # each slot needs a whole batch at hand
    for i in range(40):
        r.tasks.push(TaskMessage(f"t{i}", i))
    await eventually(lambda: len(r.tasks.acked) == 40)
    outcomes = r.outcomes()
    assert len(r.results.sent) == 40 and sorted(outcomes) == sorted(f"t{i}" for i in range(40))
    assert all(outcomes[f"t{i}"].value[0] == 2 * i for i in range(40))  # type: ignore[index]
    sizes = [o.value[1] for o in outcomes.values()]  # type: ignore[index]
    assert max(sizes) > 1 and max(sizes) <= 16
    assert all(o.ok and o.attempts == 1 for o in outcomes.values())
    assert r.runner.stats.done == 40 and r.requeue.sent == []


async def test_a_raising_batch_gives_every_task_the_error_and_retries_none(rig: Callable[..., Rig]) -> None:
    r = rig(f"{H}:fail_all")
    await eventually(lambda: r.runner.per_slot == 8)
    for i in range(3):
        r.tasks.push(TaskMessage(f"t{i}", i))
    await eventually(lambda: len(r.tasks.acked) == 3)
    errors = [o.error for o in r.results.sent]
    assert len(errors) == 3 and all(e is not None and e.type == "RuntimeError" for e in errors)
    assert r.requeue.sent == [] and r.runner.stats.failed == 3


async def test_a_wrong_number_of_results_fails_every_task_of_the_batch(rig: Callable[..., Rig]) -> None:
    r = rig(f"{H}:one_short")
    await eventually(lambda: r.runner.per_slot == 8)
    for i in range(3):
        r.tasks.push(TaskMessage(f"t{i}", i))
    await eventually(lambda: len(r.tasks.acked) == 3)
    assert {o.error.type for o in r.results.sent if o.error} == {"BatchResultMismatch"}
    assert len(r.results.sent) == 3 and not any(o.ok for o in r.results.sent)


async def test_an_unsendable_result_fails_only_its_own_task(rig: Callable[..., Rig]) -> None:
    r = rig(f"{H}:some_unsendable")
    await eventually(lambda: r.runner.per_slot == 4)
    for i, payload in enumerate(["a", "bad", "c"]):
        r.tasks.push(TaskMessage(f"t{i}", payload))
    await eventually(lambda: len(r.tasks.acked) == 3)
    o = r.outcomes()
    assert o["t0"].ok and o["t0"].value == "a" and o["t2"].ok and o["t2"].value == "c"
    assert not o["t1"].ok and o["t1"].error is not None and o["t1"].error.type == "ResultNotSerializable"


async def test_a_batch_over_the_timeout_spends_an_attempt_of_each_task(rig: Callable[..., Rig]) -> None:
    r = rig(f"{H}:sleep_all", settings=JobSettings(task_timeout=0.3, max_attempts=3))
    await eventually(lambda: r.runner.per_slot == 4)
    for i in range(3):
        r.tasks.push(TaskMessage(f"t{i}", 30.0))
    await eventually(lambda: len(r.tasks.acked) == 3)
    assert sorted(uncopied(r.requeue.sent), key=lambda t: t.task_id) == [
        TaskMessage(f"t{i}", 30.0, attempts=1) for i in range(3)
    ]
    assert r.results.sent == [] and r.runner.stats.timed_out == 3


async def test_a_crashing_batch_spends_an_attempt_of_each_task(rig: Callable[..., Rig]) -> None:
    r = rig(f"{H}:crash_all", settings=JobSettings(max_attempts=3))
    await eventually(lambda: r.runner.per_slot == 4)
    r.tasks.push(TaskMessage("a", 1))
    r.tasks.push(TaskMessage("b", 2))
    await eventually(lambda: len(r.tasks.acked) == 2)
    assert {t.task_id: t.attempts for t in r.requeue.sent} == {"a": 1, "b": 1}


async def test_immediate_preemption_puts_the_whole_batch_back_unspent(rig: Callable[..., Rig]) -> None:
    r = rig(f"{H}:sleep_all", settings=JobSettings(immediate=True))
    await eventually(lambda: r.runner.per_slot == 4)
    for i in range(3):
        r.tasks.push(TaskMessage(f"t{i}", 30.0, attempts=1))
    await eventually(lambda: r.runner.stats.busy == 1)
    await asyncio.sleep(0.1)
    began = time.monotonic()
    r.runner.resize(0)
    await eventually(lambda: r.released)
    assert time.monotonic() - began < 0.5, "the slot was not freed at once"
    await eventually(lambda: len(r.tasks.acked) == 3)
    assert sorted(uncopied(r.requeue.sent), key=lambda t: t.task_id) == [
        TaskMessage(f"t{i}", 30.0, attempts=1) for i in range(3)
    ]
    assert r.results.sent == [] and r.runner.stats.preempted == 3


async def test_a_one_task_handler_keeps_its_window_and_runs_one_task_per_call(
    rig: Callable[..., Rig],
) -> None:
    r = rig("tests.handlers.basic:echo", target=2)
    for i in range(5):
        r.tasks.push(TaskMessage(f"t{i}", i))
    await eventually(lambda: len(r.tasks.acked) == 5)
    assert r.runner.per_slot == 1 and r.runner.window.size == 1
    assert sorted(o.value for o in r.results.sent) == [0, 1, 2, 3, 4]  # type: ignore[type-var]


async def test_the_slot_describes_handlers_and_runs_a_batch_handler_alone_as_a_batch_of_one() -> None:
    slot = SlotProcess(0)
    try:
        assert await slot.describe(f"{H}:double_all") == BatchSpec(16, 0.05)
        assert await slot.describe("tests.handlers.basic:echo") is None
        assert await slot.describe("tests.handlers.nowhere:nothing") is None
        reply = await slot.run(f"{H}:double_all", "t", 21)
        assert reply.ok and reply.value == [42, 1]
        [a, b] = await slot.run_batch(f"{H}:double_all", [("a", 1), ("b", 2)])
        assert (a.task_id, a.value, b.task_id, b.value) == ("a", [2, 2], "b", [4, 2])
    finally:
        await slot.stop()
