"""``on_result``: hand every outcome of a job to a callback, in the background.

The callback runs in the consumer of the job's result stream: if it raises, its outcome is not
taken (the stream puts it back: it comes again to the next consumer, or after a resume), and the
consumer stops with :class:`CallbackFailed`, the callback's error as its cause.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from truba.client.outcome import Outcome
from truba.errors import TrubaError

log = logging.getLogger(__name__)

OutcomeCallback = Callable[[Outcome], Awaitable[None] | None]
"""Called with each outcome; may be a coroutine function."""


class CallbackFailed(TrubaError):
    """An ``on_result`` callback raised; its outcome was not taken and comes again."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"the on_result callback raised for task {task_id}; its outcome was put back")
        self.task_id = task_id


async def deliver(stream: AsyncGenerator[Outcome, None], callback: OutcomeCallback, *, job_id: str) -> None:
    """Calls ``callback`` with every outcome of ``stream``, until it ends.

    Raises:
        CallbackFailed: the callback raised (its outcome was put back).
    """
    try:
        async for outcome in stream:
            try:
                maybe = callback(outcome)
                if maybe is not None:
                    await maybe
            except Exception as exc:
                log.exception("client.callback_failed", extra={"job_id": job_id, "task_id": outcome.task_id})
                raise CallbackFailed(outcome.task_id) from exc
    finally:
        await stream.aclose()
