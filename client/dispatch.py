"""Routing a job's outcomes: a ``call``'s to its caller, a group's to its group, the rest onward.

The dispatcher is the job's result stream's router (:attr:`ResultStream.route`): an outcome whose
task a ``call`` awaits resolves that call's future, one of a group's task goes to the group, and
either is then taken (the journal forgets the task, its result is acked with the next batch):
exactly once, as any outcome. Every other outcome goes to the job's consumers (``results()``,
``on_result``, ``map``) as before. While a call or a group waits and nobody iterates the stream,
the dispatcher runs it itself (the stream's *pump*): outcomes nobody claimed are parked, not taken,
until a consumer comes. An error of the pump (every broker unreachable, the job's pipe closed)
fails the calls waiting; the next call starts the pump again.

A call's ``submit`` returns before its task can have run (the outcome needs the task published,
run by a daemon and its result read back, many loop turns later), and the caller registers its
future at once, so no outcome passes the router before its call waits for it.

The job's *drained* moment (every task submitted has its outcome taken, the job still open) fires
the ``on_drained`` callbacks, again each time it drains after more submissions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import final

from truba.client.journal import TaskJournal
from truba.client.lifecycle import JobStatus
from truba.client.outcome import Outcome
from truba.client.result_stream import ResultStream
from truba.pipes.errors import PipeClosed

log = logging.getLogger(__name__)

Claim = Callable[[Outcome], bool]
"""Takes an outcome (True) or passes it on (False)."""
DrainedCallback = Callable[[], Awaitable[None] | None]
"""Called when the job drained; may be a coroutine function."""


@final
class Dispatch:
    """The router of one job's result stream; see the module."""

    def __init__(self, job_id: str, stream: ResultStream, journal: TaskJournal, status: JobStatus) -> None:
        self._job_id = job_id
        self._stream = stream
        self._journal = journal
        self._status = status
        self._calls: dict[str, asyncio.Future[Outcome]] = {}
        """Calls waiting, by task."""
        self.claims: list[Claim] = []
        """Further routers (the groups), asked after the calls."""
        self.waiting: Callable[[], bool] = lambda: False
        """The further routers wait for outcomes (the pump must run for them)."""
        self._pump: asyncio.Task[bool] | None = None
        self._drained: list[DrainedCallback] = []
        self._drained_at = 0
        """Tasks recorded when the job last drained: it drains again only after more."""
        self._running: set[asyncio.Task[None]] = set()
        stream.route = self.route
        stream.idle = self.pump

    # -- routing -------------------------------------------------------------------------------

    def route(self, outcome: Outcome) -> bool:
        """True if a call or a group took ``outcome``."""
        if self._calls:
            future = self._calls.pop(outcome.task_id, None)
            if future is not None and not future.done():
                future.set_result(outcome)
                return True
        for claim in self.claims:  # a loop, not any(): no generator per outcome
            if claim(outcome):
                return True
        return False

    def expect(self, task_id: str) -> asyncio.Future[Outcome]:
        """A call waits for ``task_id``'s outcome: the future it gets it from."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._calls[task_id] = future
        self.pump()
        return future

    def forget(self, task_id: str) -> None:
        """The call gave up (timeout, cancelled): its outcome goes to the consumers."""
        self._calls.pop(task_id, None)

    # -- the pump ------------------------------------------------------------------------------

    def _wanted(self) -> bool:
        return bool(self._calls) or self.waiting()

    def pump(self) -> None:
        """Runs the stream for the calls and groups waiting, unless it runs, a consumer iterates
        (it routes; when the last one stops, the stream calls this again) or nobody waits."""
        if self._pump is not None and not self._pump.done():
            return
        if not self._wanted() or self._status.cancelled or self._stream.consumers:
            return
        self._pump = asyncio.create_task(self._run_pump(), name=f"dispatch-{self._job_id}")
        self._pump.add_done_callback(self._pump_ended)

    def _pump_ended(self, pump: asyncio.Task[bool]) -> None:
        """A call or group that came while the pump was ending (nobody waited, and it was acking
        the last outcomes) found it still running: run it again for them."""
        if not pump.cancelled() and pump.exception() is None and pump.result():
            self.pump()

    async def _run_pump(self) -> bool:
        """Runs the stream as the pump; True if it ended because nobody waited (or a consumer
        took over), False if it failed (the calls waiting failed with it)."""
        stream = self._stream.outcomes(pump=self._wanted)
        try:
            async for _ in stream:  # the pump yields nothing: what it does not route it parks
                pass
            return True
        except Exception as exc:  # the job detached here (PipeClosed), or the cluster is away
            level = logging.INFO if isinstance(exc, PipeClosed) else logging.WARNING
            log.log(level, "client.dispatch.pump_failed", extra={"job_id": self._job_id, "error": repr(exc)})
            calls, self._calls = self._calls, {}
            for future in calls.values():
                if not future.done():
                    future.set_exception(exc)
            return False
        finally:
            await stream.aclose()

    # -- drained -------------------------------------------------------------------------------

    def on_drained(self, callback: DrainedCallback) -> None:
        """Calls ``callback`` whenever the job drains; at once if it is drained now."""
        self._drained.append(callback)
        self.taken()

    def taken(self) -> None:
        """An outcome was taken: has the job drained (open, every task with its outcome)?"""
        status, journal = self._status, self._journal
        if not self._drained or status.closed or status.cancelled or len(journal):
            return
        if journal.recorded <= self._drained_at:
            return
        self._drained_at = journal.recorded
        log.info("client.job.drained", extra={"job_id": self._job_id, "submitted": journal.recorded})
        for callback in self._drained:
            self._run(callback)

    def _run(self, callback: DrainedCallback) -> None:
        task = asyncio.create_task(_call(callback, self._job_id), name=f"drained-{self._job_id}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)


async def _call(callback: DrainedCallback, job_id: str) -> None:
    try:
        maybe = callback()
        if maybe is not None:
            await maybe
    except Exception:
        log.exception("client.job.drained_callback_failed", extra={"job_id": job_id})
