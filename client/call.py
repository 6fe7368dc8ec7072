"""``job.call``: submit one task and wait for its outcome (seed 004's PUT … WAIT).

The outcome reaches the call through the job's dispatcher (:mod:`truba.client.dispatch`), taken
exactly once there. A call that times out (:class:`CallTimeout`) or is cancelled stops waiting;
its task keeps running, and its outcome, when it comes, goes to the job's consumers
(``results()``, ``on_result``, ``map``) like any other task's, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from truba.client.dispatch import Dispatch
from truba.client.outcome import Outcome
from truba.errors import TrubaError


class CallTimeout(TrubaError, TimeoutError):
    """``call(timeout=...)`` ran out before the task's outcome came. The task goes on; its
    outcome goes to the job's consumers (``results()``, ``on_result``)."""

    def __init__(self, task_id: str, timeout: float) -> None:
        super().__init__(
            f"task {task_id}: no outcome within {timeout} s; it still runs, and its outcome goes to results()"
        )
        self.task_id = task_id


async def call_task(
    dispatch: Dispatch, submit: Callable[[], Awaitable[str]], timeout: float | None
) -> Outcome:
    """Submits one task (``submit``) and returns its outcome; see :meth:`Job.call`.

    Raises:
        CallTimeout: no outcome within ``timeout`` seconds (the task goes on).
    """
    task_id = await submit()
    future = dispatch.expect(task_id)  # at once: no outcome can pass before (see dispatch)
    try:
        done, _ = await asyncio.wait((future,), timeout=timeout)
    finally:
        if not future.done():  # timed out, or the caller was cancelled
            dispatch.forget(task_id)
            future.cancel()
    if not done:
        raise CallTimeout(task_id, timeout or 0.0)
    return future.result()
