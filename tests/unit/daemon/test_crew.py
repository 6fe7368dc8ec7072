"""Which workers leave when the slot count drops, and which are interrupted."""

from __future__ import annotations

import asyncio
from typing import cast

from truba.daemon.crew import Crew, Worker
from truba.daemon.slot_process import SlotProcess
from truba.pipes.errors import PipeBroken


async def crew_of(busy_since: list[float | None]) -> tuple[Crew, list[Worker]]:
    """A crew with a worker per entry: busy since that time, or idle (None)."""
    crew = Crew(len(busy_since))
    workers = []
    for index, since in enumerate(busy_since):
        worker = Worker(cast(SlotProcess, index), busy=since is not None, started_at=since or 0.0)
        crew.workers[worker] = asyncio.create_task(asyncio.sleep(0))
        workers.append(worker)
    return crew, workers


async def test_idle_workers_leave_first_and_busy_ones_finish_when_preemption_is_graceful() -> None:
    crew, [idle, busy_a, busy_b] = await crew_of([None, 1.0, 2.0])
    crew.resize(1, interrupt=False)
    assert idle.leaving and idle.wake.is_set()
    assert not busy_a.leaving and not busy_b.leaving
    assert not busy_a.interrupt.is_set() and not busy_b.interrupt.is_set()
    # The first busy worker to come round leaves; then the crew is at its target.
    assert crew.leaves(busy_b) and busy_b.leaving
    assert not crew.leaves(busy_a) and crew.staying == 1


async def test_immediate_preemption_interrupts_the_most_recently_started_tasks() -> None:
    crew, [older, newer, newest] = await crew_of([1.0, 2.0, 3.0])
    crew.resize(1, interrupt=True)
    assert newest.interrupt.is_set() and newer.interrupt.is_set() and not older.interrupt.is_set()
    assert crew.staying == 1 and crew.target == 1


async def test_every_worker_leaves_after_a_pipe_broke_or_a_stop() -> None:
    crew, [worker] = await crew_of([None])
    assert not crew.going(worker)
    crew.broke(PipeBroken("first"))
    crew.broke(PipeBroken("second"))
    assert crew.going(worker) and crew.leaves(worker)
    assert crew.failure is not None and str(crew.failure) == "first"
    crew, [busy] = await crew_of([1.0])
    crew.stop_now()
    assert busy.leaving and busy.interrupt.is_set() and crew.now and crew.closing


async def test_a_graceful_grace_interrupts_the_tasks_still_running_when_it_is_over() -> None:
    crew, [older, newer, newest] = await crew_of([1.0, 2.0, 3.0])
    crew.resize(1, interrupt=False, grace=0.05)
    assert not any(w.interrupt.is_set() for w in (older, newer, newest))
    # One task ends within the grace: its worker leaves; one over the target is left.
    assert crew.leaves(newer) and crew.staying == 2
    await asyncio.sleep(0.1)
    assert newest.interrupt.is_set() and newest.leaving
    assert not older.interrupt.is_set() and not newer.interrupt.is_set()
    assert crew.staying == 1


async def test_a_grace_interrupts_nothing_if_the_slots_came_back_meanwhile() -> None:
    crew, workers = await crew_of([1.0, 2.0])
    crew.resize(1, interrupt=False, grace=0.05)
    crew.resize(2, interrupt=False, grace=0.05)
    await asyncio.sleep(0.1)
    assert not any(w.interrupt.is_set() or w.leaving for w in workers)


async def test_without_a_grace_as_in_a_drain_tasks_are_never_interrupted() -> None:
    crew, workers = await crew_of([1.0, 2.0])
    crew.resize(0, interrupt=False)
    await asyncio.sleep(0.1)
    assert not any(w.interrupt.is_set() for w in workers)
