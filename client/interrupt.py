"""Ctrl-C in a blocking call: the call ends with KeyboardInterrupt, quickly, and its job keeps
running in the cluster, resumable.

The blocking facade runs each call as a coroutine on the client's loop thread and waits for it
in the caller's thread, where SIGINT raises KeyboardInterrupt. :func:`run_on` then cancels the
coroutine and waits (at most :data:`UNWIND_SECONDS`) until it has unwound, so that nothing of it
still runs when the caller's ``finally`` blocks use the job. The facade then detaches the job
(its journal keeps every task without an outcome; confirms are waited for at most
:data:`DETACH_SECONDS`) and says on one line how to resume or cancel it (:func:`left_running`).
The job is the user's to cancel: an interrupt never cancels it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Final, TypeVar

from truba.client.notices import notice

log = logging.getLogger(__name__)

R = TypeVar("R")

UNWIND_SECONDS: Final = 1.0
"""Seconds an interrupted call has to unwind on the loop thread before the interrupt goes on."""
DETACH_SECONDS: Final = 0.5
"""Seconds an interrupted job's detach waits for confirms and acks."""


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[object, object, R]) -> R:
    """Runs ``coro`` on ``loop`` (another thread's) and waits for its result; an interrupt
    (KeyboardInterrupt, SystemExit) while waiting cancels it, waits for it to unwind, and goes on."""
    unwound = threading.Event()

    async def tracked() -> R:
        try:
            return await coro
        finally:
            unwound.set()

    outer = tracked()
    future = asyncio.run_coroutine_threadsafe(outer, loop)
    try:
        return future.result()
    except (KeyboardInterrupt, SystemExit):
        future.cancel()
        deadline = time.monotonic() + UNWIND_SECONDS
        while not unwound.wait(0.01):
            if inspect.getcoroutinestate(outer) == inspect.CORO_CLOSED:  # cancelled before it began
                coro.close()
                break
            if time.monotonic() > deadline:
                log.warning("client.interrupt.slow_unwind", extra={"seconds": UNWIND_SECONDS})
                break
        raise


def left_running(job_id: str, *, resumable: bool = True) -> None:
    """Tells the user, on one line, that a job left behind goes on and how to pick it up."""
    cancel = f"cancel it with client.job('{job_id}').cancel()"
    if resumable:
        text = f"job {job_id} keeps running; resume it with client.resume('{job_id}') or {cancel}"
    else:  # journal=False: nobody can take its outcomes any more
        text = f"job {job_id} keeps running, with no journal to resume it from; {cancel}"
    notice(log, "client.job.left_running", text, job_id=job_id)
