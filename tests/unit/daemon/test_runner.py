"""The task life on one daemon, over in-memory pipes and a real slot process."""

from __future__ import annotations

import asyncio

from truba.daemon.runner import JobRunner
from truba.daemon.slots import SlotProcess
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import ResultMessage, TaskMessage


async def _eventually(condition: object, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_a_task_is_acked_only_after_its_result_is_confirmed() -> None:
    tasks: FakeListener[TaskMessage] = FakeListener()
    results: FakeSender[ResultMessage] = FakeSender()
    released: list[SlotProcess] = []
    runner = JobRunner("j1", "tests.handlers.basic:square", "d1", tasks, results, released.append, target=1)
    slot = SlotProcess(0)
    runner.add_worker(slot)
    tasks.push(TaskMessage("t1", 3))
    await _eventually(lambda: results.sent)
    assert results.sent[0].task_id == "t1" and results.sent[0].value == 9
    await asyncio.sleep(0.05)
    assert tasks.acked == []  # the result is not confirmed yet
    results.confirm()
    await _eventually(lambda: tasks.acked)
    assert tasks.acked == [TaskMessage("t1", 3)]
    assert runner.stats.done == 1
    await runner.close()
    assert released == [slot] and tasks.closed and results.closed
    await slot.stop()


async def test_an_error_outcome_is_a_result_too_and_a_rejected_result_requeues_the_task() -> None:
    tasks: FakeListener[TaskMessage] = FakeListener()
    results: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
    runner = JobRunner("j1", "tests.handlers.basic:square", "d1", tasks, results, lambda s: None, target=1)
    slot = SlotProcess(0)
    runner.add_worker(slot)
    tasks.push(TaskMessage("bad", -1))
    await _eventually(lambda: tasks.acked)
    assert not results.sent[0].ok and results.sent[0].error is not None
    assert results.sent[0].error.type == "ValueError"
    assert runner.stats.failed == 1
    # A broker nack of the result: the task goes back to its queue instead of being acked.
    results.auto_confirm = False
    tasks.push(TaskMessage("t2", 2))
    await _eventually(lambda: len(results.sent) == 2)
    results.reject()
    await _eventually(lambda: tasks.rejected)
    assert tasks.rejected[0] == (TaskMessage("t2", 2), True)
    # The requeued task comes back (redelivered); this time its result is confirmed.
    results.auto_confirm = True
    results.confirm()
    await _eventually(lambda: TaskMessage("t2", 2) in tasks.acked)
    await runner.close()
    await slot.stop()


async def test_a_slot_crash_requeues_the_task_and_the_worker_goes_on() -> None:
    tasks: FakeListener[TaskMessage] = FakeListener()
    results: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
    runner = JobRunner("j1", "tests.handlers.basic:crash", "d1", tasks, results, lambda s: None, target=1)
    slot = SlotProcess(0)
    runner.add_worker(slot)
    tasks.push(TaskMessage("t1", None))
    await _eventually(lambda: tasks.rejected)
    assert tasks.rejected[0] == (TaskMessage("t1", None), True)
    assert results.sent == []
    await runner.close()
    await slot.stop()
