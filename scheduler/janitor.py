"""Keeps the brokers' queues in line with the jobs: deletes stale queues, restores missing ones.

- **Delete.** A job id in the store's stale ledger (see :mod:`truba.scheduler.store`) has queues
  that must go. :meth:`QueueJanitor.reap` deletes them on every broker in the background,
  retrying each broker with capped exponential backoff until it succeeds, and only then removes
  the id from the ledger. A broker that stays down is retried forever and logged at every
  attempt: a queue left behind is never forgotten, and after a restart :meth:`resume` picks the
  ledger up again.
- **Restore.** At startup, :meth:`restore` declares the queues of every runnable job once on each
  broker (idempotent), so a broker that was added or lost its data gets them back. A broker that
  fails is skipped with a warning. Deletions wait for this pass, so it cannot re-create a queue
  that a FinishJob just deleted.
- **Sweep again.** Clients and daemons re-declare a job's queues when they reconnect to a broker
  (so a broker whose data was wiped gets them back). A daemon reconnecting in the moment between
  a job's end and the assignment that takes the job away could re-create a deleted queue, so
  every deletion is repeated :data:`RESWEEP_AFTER` seconds later, and again after as long once
  more (best effort: in memory). The first sweep catches the daemons that took the job's last
  assignment a moment late, the second a reconnect in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Final, final

from truba.backoff import Backoff
from truba.pipes.errors import PipeError
from truba.scheduler.brokers import BrokerAdmin, Brokers
from truba.scheduler.model import JobQueues, job_queues
from truba.scheduler.store import JobStore

log = logging.getLogger(__name__)

RESWEEP_AFTER: Final = 2.0
"""Seconds after a job's queues were deleted before they are deleted once more (then again
after :data:`RESWEEP_LAST` seconds)."""
RESWEEP_LAST: Final = 30.0

EXPIRE_EVERY: Final = 60.0
"""Seconds at most between two looks for dead-letter queues whose keep time is past."""

DELETE_BACKOFF: Final = Backoff(attempts=None, base=0.5, cap=30.0)
"""Waits between deletions of a job's queues on a broker that refuses them: until it succeeds."""


@final
class QueueJanitor:
    """Deletes stale job queues on every broker until done; restores runnable jobs' queues."""

    def __init__(
        self,
        brokers: Brokers,
        store: JobStore,
        *,
        backoff: Backoff = DELETE_BACKOFF,
        resweep_after: float = RESWEEP_AFTER,
        clock: Callable[[], float] = time.time,
        expire_every: float = EXPIRE_EVERY,
    ) -> None:
        self._clock = clock
        self._expire_every = expire_every
        self._dead_kept = asyncio.Event()
        """Set when a job ended keeping its dead letters: :meth:`watch_dead` looks at its deadline."""
        self._resweep_after = resweep_after
        self._resweeps: set[asyncio.Task[None]] = set()
        self._brokers = brokers
        self._store = store
        self._backoff = backoff
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restoring: asyncio.Task[None] | None = None

    def pending(self) -> set[str]:
        """Job ids whose queues are still being deleted."""
        return set(self._tasks)

    def reap(self, job_id: str) -> asyncio.Task[None]:
        """Starts deleting ``job_id``'s queues everywhere (or returns the deletion under way).

        The id must already be in the stale ledger; the task removes it when every broker is done.
        """
        task = self._tasks.get(job_id)
        if task is None:
            task = asyncio.create_task(self._reap(job_id), name=f"reap-{job_id}")
            self._tasks[job_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(job_id, None))
        return task

    async def reap_within(self, job_id: str, timeout: float) -> bool:
        """Like :meth:`reap`, then waits up to ``timeout`` seconds; True if the queues are gone.

        The deletion goes on in the background after a timeout (or if the caller is cancelled).
        """
        task = self.reap(job_id)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        return bool(done)

    def resume(self) -> None:
        """Restarts the deletion of every job in the stale ledger (at startup)."""
        for job_id in self._store.stale():
            self.reap(job_id)

    def restore(self, jobs: Iterable[JobQueues]) -> None:
        """Declares the queues of live jobs once on every broker, in the background."""
        queues = list(jobs)
        if queues:
            self._restoring = asyncio.create_task(self._restore(queues), name="restore-queues")

    async def _restore(self, queues: list[JobQueues]) -> None:
        await asyncio.gather(*(self._restore_on(broker, queues) for broker in self._brokers.all))

    async def _restore_on(self, broker: BrokerAdmin, queues: list[JobQueues]) -> None:
        for done, job in enumerate(queues):
            try:
                await broker.declare(job)
            except PipeError as exc:
                # The broker is down or slow: one timeout is enough, skip the rest of the jobs.
                log.warning(
                    "sched.queues.restore_failed",
                    extra={"broker": broker.info.name, "jobs_left": len(queues) - done, "error": str(exc)},
                )
                return
        log.info("sched.queues.restored", extra={"broker": broker.info.name, "jobs": len(queues)})

    async def expire_dead(self) -> list[str]:
        """Deletes every kept dead-letter queue whose deadline is past; returns their job ids.

        A broker that fails keeps the job's deadline in the store: the next pass tries again.
        """
        now = self._clock()
        expired = []
        for job_id, until in self._store.dead_kept():
            if until > now:
                break
            dead = job_queues(job_id).dead
            results = await asyncio.gather(
                *(broker.delete_dead(dead) for broker in self._brokers.all), return_exceptions=True
            )
            failed = [
                f"{broker.info.name}: {result}"
                for broker, result in zip(self._brokers.all, results, strict=True)
                if isinstance(result, PipeError)
            ]
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, PipeError):
                    raise result
            if failed:
                log.warning("sched.dead.delete_failed", extra={"job_id": job_id, "errors": failed})
                continue
            self._store.forget_dead(job_id)
            expired.append(job_id)
            log.info("sched.dead.deleted", extra={"job_id": job_id, "kept_until": until})
        return expired

    async def watch_dead(self) -> None:
        """Runs :meth:`expire_dead` at every deadline (at least every ``expire_every`` seconds)
        until cancelled."""
        while True:
            await self.expire_dead()
            kept = self._store.dead_kept()
            wait = self._expire_every
            if kept:
                wait = min(wait, max(0.0, kept[0][1] - self._clock()))
            self._dead_kept.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dead_kept.wait(), max(wait, 0.01))

    async def _reap(self, job_id: str) -> None:
        if self._restoring is not None:
            await asyncio.wait({self._restoring})
        await asyncio.gather(*(self._reap_on(broker, job_id) for broker in self._brokers.all))
        self._store.forget_stale(job_id)
        if self._keeps_dead(job_id):
            self._dead_kept.set()
        log.info("sched.queues.deleted", extra={"job_id": job_id})
        task = asyncio.create_task(self._resweep(job_id), name=f"resweep-{job_id}")
        self._resweeps.add(task)
        task.add_done_callback(self._resweeps.discard)

    def _keeps_dead(self, job_id: str) -> bool:
        return self._store.dead_until(job_id) is not None

    async def _resweep(self, job_id: str) -> None:
        queues = job_queues(job_id)
        waited = 0.0
        for at in (self._resweep_after, max(self._resweep_after, RESWEEP_LAST)):
            await asyncio.sleep(at - waited)
            waited = at
            for broker in self._brokers.all:
                try:
                    await broker.delete(queues, keep_dead=self._keeps_dead(job_id))
                except PipeError as exc:  # best effort: the first deletion succeeded
                    log.info(
                        "sched.queues.resweep_failed",
                        extra={"job_id": job_id, "broker": broker.info.name, "error": str(exc)},
                    )
            log.debug("sched.queues.resweeped", extra={"job_id": job_id, "after": at})

    async def _reap_on(self, broker: BrokerAdmin, job_id: str) -> None:
        queues = job_queues(job_id)
        attempt = 0
        while True:
            try:
                await broker.delete(queues, keep_dead=self._keeps_dead(job_id))
            except PipeError as exc:
                delay = self._backoff.delay(attempt)  # jittered: brokers back are not hit in lockstep
                attempt += 1
                log.warning(
                    "sched.queues.delete_failed",
                    extra={
                        "job_id": job_id,
                        "broker": broker.info.name,
                        "queues": list(queues.all()),
                        "attempt": attempt,
                        "retry_in": round(delay, 2),
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
                await self._backoff.sleep(delay)
            else:
                if attempt:
                    log.info(
                        "sched.queues.delete_recovered", extra={"job_id": job_id, "broker": broker.info.name}
                    )
                return

    async def close(self) -> None:
        """Stops the background work; the stale ledger keeps what is left for the next start."""
        postponed = sorted(job_id for job_id, task in self._tasks.items() if not task.done())
        tasks = [*self._tasks.values(), *self._resweeps, *([self._restoring] if self._restoring else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if postponed:
            log.warning("sched.queues.delete_postponed", extra={"jobs": postponed})
