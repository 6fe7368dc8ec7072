"""The compute daemon: S slot processes, lent to jobs as the scheduler assigns them.

The daemon keeps the scheduler's latest assignment (slots and settings per job) as its desired
state and reconciles towards it whenever something changes: a runner per assigned job, each with
as many workers as it has slots, every worker holding one slot process. A slot taken from a job
moves to the job that needs it after the running task ends (graceful preemption) or at once, the
task going back to its queue unspent (immediate preemption, a per-job setting).

Draining (the first SIGTERM/SIGINT, or the scheduler's ``Drain``): heartbeats say so, no task is
taken any more, running tasks finish and their results are confirmed and acked, then the daemon
exits. Stopping now (a second signal, or ``--drain-timeout`` passed): running tasks are
interrupted and go back to their queues unspent, then the daemon exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Final

from truba.daemon.allow import is_allowed
from truba.daemon.broker_meter import metered
from truba.daemon.control import SchedulerLink
from truba.daemon.forkserver import ForkServer
from truba.daemon.hand_back_records import HandBackRecords
from truba.daemon.job_pipes import JobPipes, Wanted, open_job_pipes
from truba.daemon.launch import Launcher, Spawn
from truba.daemon.metrics import DaemonMetrics
from truba.daemon.pipe_size import pipe_bytes_for
from truba.daemon.runner import JobRunner, SlotPolicy
from truba.daemon.settings import JobSettings
from truba.daemon.shutdown import bounded
from truba.daemon.slot_process import SlotProcess
from truba.daemon.spans import SpanLog
from truba.daemon.stats import JobStats
from truba.daemon.wiring import default_brokers
from truba.pipes.broker import Broker, BrokerFactory, redact
from truba.pipes.prefetch import Window
from truba.proto.v1 import daemons_pb2
from truba.queues import queues_of

log = logging.getLogger(__name__)
REOPEN_DELAY: Final = 1.0
STATS_REPORTED: Final = 60.0
"""Seconds a job's counters are still reported after it left this daemon (its last ends land)."""
STATS_KEPT: Final = 3600.0
"""Seconds a job's counters are kept after that: if it comes back meanwhile, they go on (never
backwards, the scheduler takes differences); after that they start again from zero."""
PREFETCH_EXTRA: Final = 2
"""Deliveries a job of short tasks may hold per broker beyond its slots. A task frame is acked
only once all its members' results are confirmed, so the window must cover that confirm's
latency too, or slots wait for the next frame. W1 (``bench/e2e.py --w1-only``, 2 slots,
interleaved, 2026-11-28): truba/raw 8.34x median with 1, 9.01x with 2 (higher in 4 of 4
pairs), 7.85x against 7.30x for 4 against 2 (3 of 4) on a slower hour. Each frame carries at
most about 5 ms of handler time (the client's frame sizing), so 2 more hold little work from
other daemons' idle slots (and held members go back after 0.1 s, see intake)."""
SHORT_TASK: Final = 0.05
"""Seconds: a job whose tasks take less (moving average) gets ``prefetch_extra`` deliveries more."""
RECONCILE_EVERY = 1.0
"""Seconds a reconciliation waits for a change before it runs anyway (windows follow task lengths)."""


@dataclass
class DaemonConfig:
    """How a daemon runs. ``allow`` holds fnmatch patterns over ``module:function``.

    ``prefetch_extra``: deliveries per broker beyond the job's slots. ``drain_timeout``: seconds
    a drain may take before running tasks are interrupted (None: as long as they run).
    ``stop_confirm_timeout``: seconds an immediate stop waits for confirms of what it put back.
    ``fork_server``: fork slots from a template that preloaded the assigned jobs' handlers (see
    :mod:`truba.daemon.forkserver`); else spawn a fresh interpreter per slot.
    """

    scheduler: str
    slots: int
    allow: list[str]
    daemon_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    broker_heartbeat: float = 10.0
    policy: SlotPolicy = field(default_factory=SlotPolicy)
    prefetch_extra: int = PREFETCH_EXTRA
    drain_timeout: float | None = None
    stop_confirm_timeout: float = 5.0
    fork_server: bool = True


class Daemon:
    """Runs assigned jobs on its slots; see the module docstring."""

    def __init__(self, config: DaemonConfig, *, brokers: BrokerFactory | None = None) -> None:
        """``brokers`` opens the link to a broker the scheduler lists (default: RabbitMQ)."""
        self.config = config
        self.metrics = DaemonMetrics(config.daemon_id)
        """Its Prometheus registry (served by ``truba daemon --metrics``)."""
        self._open_broker = metered(
            brokers
            or default_brokers(
                config.daemon_id, heartbeat=config.broker_heartbeat, on_connect=self.metrics.broker_connected
            ),
            self.metrics,
        )
        self.link = SchedulerLink(config.scheduler, self)
        pipe_bytes = pipe_bytes_for(config.slots)  # within the user's pipe budget (see pipe_size)
        self._launcher: Launcher = (
            ForkServer(pipe_bytes=pipe_bytes) if config.fork_server else Spawn(pipe_bytes)
        )
        self._slots = [SlotProcess(i, self._launcher) for i in range(config.slots)]
        self._free: list[SlotProcess] = list(self._slots)
        self._brokers: list[str] = []
        self._links: list[Broker] = []
        self._wanted: dict[str, Wanted] = {}
        self._version = 0
        self._runners: dict[str, JobRunner] = {}
        self._closing: dict[JobRunner, asyncio.Task[None]] = {}
        self._stats: dict[str, JobStats] = {}
        self._stats_seen: dict[str, float] = {}
        self._spans = SpanLog()
        self._records = HandBackRecords()
        self._retry_at: dict[str, float] = {}
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._draining = False
        self._now = False
        self.metrics.watch(self)

    @property
    def draining(self) -> bool:
        return self._draining

    # -- what the scheduler link calls ---------------------------------------------------------

    def hello(self) -> daemons_pb2.Hello:
        return daemons_pb2.Hello(
            daemon_id=self.config.daemon_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            slots=self.config.slots,
            allow=self.config.allow,
            version="0.1.0",
            running=self._running(),
        )

    def heartbeat(self) -> daemons_pb2.Heartbeat:
        now = time.monotonic()
        for job_id in self._jobs_here():
            self._stats_seen[job_id] = now
        for job_id, seen in list(self._stats_seen.items()):
            if now - seen > STATS_KEPT:
                del self._stats_seen[job_id]
                self._stats.pop(job_id, None)
        stats = [
            s.to_proto(job_id)
            for job_id, s in self._stats.items()
            if now - self._stats_seen.get(job_id, now) <= STATS_REPORTED
        ]
        spans, dropped = self._spans.take()
        attempts, left_out = self._spans.running_now()
        return daemons_pb2.Heartbeat(
            applied_version=self._version,
            applied_epoch=self.link.applied_epoch,
            running=self._running(),
            stats=stats,
            draining=self._draining,
            spans=spans,
            spans_dropped=dropped,
            attempts=attempts,
            attempts_left_out=left_out,
        )

    def slot_use(self) -> tuple[int, int]:
        """``(slots, busy slots)`` now (for the metrics)."""
        return self.config.slots, sum(s.busy for s in self._stats.values())

    def _jobs_here(self) -> set[str]:
        return set(self._runners) | {r.job_id for r in self._closing}

    def _running(self) -> list[daemons_pb2.JobSlots]:
        slots: dict[str, int] = {}
        handlers: dict[str, str] = {}
        for runner in [*self._runners.values(), *self._closing]:
            slots[runner.job_id] = slots.get(runner.job_id, 0) + runner.active
            handlers[runner.job_id] = runner.handler
        return [daemons_pb2.JobSlots(job_id=j, handler=handlers[j], slots=n) for j, n in slots.items()]

    def welcome(self, welcome: daemons_pb2.Welcome) -> None:
        brokers = [b.url for b in welcome.brokers]
        if brokers != self._brokers:
            log.info("daemon.brokers", extra={"brokers": [redact(u) for u in brokers]})
            self._brokers = brokers
            # Links to brokers no longer listed close with their runners' pipes; new ones start lazily.
            self._links = [self._open_broker(url) for url in brokers]
            self._changed.set()

    def assign(self, assignment: daemons_pb2.Assignment) -> None:
        wanted: dict[str, Wanted] = {}
        for job in assignment.jobs:
            if not is_allowed(job.handler, self.config.allow):
                # The scheduler should never do this; the daemon is the security boundary anyway.
                log.error("daemon.job.refused", extra={"job_id": job.job_id, "handler": job.handler})
                continue
            queues = queues_of(job.queues, job.settings)
            wanted[job.job_id] = Wanted(
                job.handler,
                job.slots,
                queues.spec(queues.tasks),
                queues.spec(queues.results),
                queues.spec(queues.dead),
                JobSettings.from_proto(job.settings),
                queues.spec(queues.result_log),
            )
        log.info(
            "daemon.assigned",
            extra={"version": assignment.version, "jobs": {j: w.slots for j, w in wanted.items()}},
        )
        self._wanted = wanted
        self._version = assignment.version
        if isinstance(self._launcher, ForkServer):  # slots forked from now on import them up front
            self._launcher.preload(job.handler for job in wanted.values())
        self._changed.set()

    def drain(self, reason: str = "scheduler") -> None:
        """Finish running tasks, take no new ones, then exit (see the module docstring)."""
        if self._draining:
            return
        self._draining = True
        log.info("daemon.draining", extra={"reason": reason, "running": self._running_counts()})
        if self.config.drain_timeout is not None:
            asyncio.get_running_loop().call_later(self.config.drain_timeout, self.stop_now)
        self.link.nudge()
        self._changed.set()

    def stop(self) -> None:
        """Same as :meth:`drain` (kept for callers of the first daemon API)."""
        self.drain("stop")

    def stop_now(self) -> None:
        """Interrupt running tasks (back to their queues, unspent), confirm, then exit."""
        if self._now:
            return
        self._draining = self._now = True
        log.info("daemon.stopping_now", extra={"running": self._running_counts()})
        for runner in [*self._runners.values(), *self._closing]:
            runner.stop_now()
        self._changed.set()

    def _running_counts(self) -> dict[str, int]:
        return {r.job_id: r.stats.busy for r in [*self._runners.values(), *self._closing]}

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Runs until drained or stopped; then closes everything."""
        log.info(
            "daemon.starting",
            extra={
                "daemon_id": self.config.daemon_id,
                "slots": self.config.slots,
                "allow": self.config.allow,
            },
        )
        if not isinstance(self._launcher, ForkServer):
            # Spawned interpreters come up in parallel now. Forked slots start on first use,
            # from a template that preloaded the assigned handlers (forking takes milliseconds).
            await asyncio.gather(*(slot.start() for slot in self._slots))
        link = asyncio.create_task(self.link.run(self._stop))
        try:
            while not (self._draining and not self._runners and not self._closing):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), RECONCILE_EVERY)
                self._changed.clear()
                await self._reconcile()
        finally:
            await self._shutdown(link)

    async def _shutdown(self, link: asyncio.Task[None]) -> None:
        log.info("daemon.stopping", extra={"running": list(self._jobs_here())})
        for runner in list(self._runners.values()):
            self._close_later(runner)
        self._runners.clear()
        await asyncio.gather(*self._closing.values(), return_exceptions=True)
        # Every end is settled now: the steps below lose nothing if one hangs (see shutdown; a
        # hand-back record not sent only leaves its member to run twice if its frame comes back).
        await bounded("hand_back_records", self._records.close())
        await bounded("slots", asyncio.gather(*(slot.stop() for slot in self._slots), return_exceptions=True))
        await bounded("launcher", self._launcher.close())
        await bounded("brokers", asyncio.gather(*(b.close() for b in self._links), return_exceptions=True))
        self._stop.set()
        await bounded("scheduler_link", link)
        log.info("daemon.stopped")

    # -- reconciliation ------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        wanted = {} if self._draining else self._wanted
        for job_id, runner in list(self._runners.items()):
            job = wanted.get(job_id)
            target = job.slots if job is not None else 0
            if self._draining:
                runner.resize(0, immediate=self._now)
            else:
                runner.resize(target, job.settings if job is not None else None)
            if target > 0 and runner.failure is None:
                await runner.window.resize(self._window_for(target, job_id))
            if runner.failure is not None or target == 0:
                if runner.failure is not None:
                    log.warning("daemon.job.reopen", extra={"job_id": job_id, "error": repr(runner.failure)})
                    self._retry_at[job_id] = time.monotonic() + REOPEN_DELAY
                del self._runners[job_id]
                self._close_later(runner)
        for job_id, job in wanted.items():
            if job_id not in self._runners and job.slots > 0 and self._brokers:
                if time.monotonic() >= self._retry_at.get(job_id, 0.0):
                    self._open_runner(job_id, job)
        for runner in self._runners.values():
            while runner.active < runner.target and self._free:
                runner.add_worker(self._free.pop())

    def _close_later(self, runner: JobRunner) -> None:
        task = asyncio.create_task(runner.close())
        self._closing[runner] = task

        def closed(_: asyncio.Task[None]) -> None:
            self._closing.pop(runner, None)
            if runner.job_id not in self._jobs_here():  # it left this daemon: its series go
                self.metrics.forget(runner.job_id)
                self._records.left(runner.job_id)
            self._changed.set()

        task.add_done_callback(closed)

    def _release(self, slot: SlotProcess) -> None:
        self._free.append(slot)
        self._changed.set()

    def _window_for(self, slots: int, job_id: str) -> int:
        """Prefetch: the job's slots, plus ``prefetch_extra`` only for a job whose tasks are
        known to be short (then the round trip to fetch the next task is a large part of a
        task's time); longer tasks get no extra, so no daemon holds a task it is not running.
        A batch handler's slot needs ``max_size`` deliveries at hand (its runner learns that from
        the first slot that describes the handler, and widens the window itself then). Tasks
        waiting out a retry backoff hold a delivery each without a slot: one more each."""
        stats = self._stats.get(job_id)
        short = stats is not None and 0.0 < stats.service_time < SHORT_TASK
        runner = self._runners.get(job_id)
        per_slot = runner.per_slot if runner is not None else 1
        retrying = runner.returns.retrying if runner is not None else 0  # their deliveries wait unacked
        return max(1, slots * per_slot + retrying + (self.config.prefetch_extra if short else 0))

    def _open_runner(self, job_id: str, job: Wanted) -> None:
        window = Window(self._window_for(job.slots, job_id))
        stats = self._stats.setdefault(job_id, JobStats())
        stats.first_ran = self._changed.set  # its window may grow once its task length is known
        self._stats_seen[job_id] = time.monotonic()
        self._runners[job_id] = JobRunner(
            job_id,
            job.handler,
            self.config.daemon_id,
            self._open_pipes(job_id, job, window),
            self._release,
            target=job.slots,
            settings=job.settings,
            stats=stats,
            policy=self.config.policy,
            window=window,
            stop_timeout=self.config.stop_confirm_timeout,
            spans=self._spans.for_job(job_id),
            meter=self.metrics.job(job_id),
        )
        log.info(
            "daemon.job.opened",
            extra={
                "job_id": job_id,
                "handler": job.handler,
                "slots": job.slots,
                "immediate": job.settings.immediate,
                "task_timeout": job.settings.task_timeout,
                "max_attempts": job.settings.max_attempts,
            },
        )

    def _open_pipes(self, job_id: str, job: Wanted, window: Window) -> JobPipes:
        """The job's pipes over the brokers the scheduler listed (they connect lazily), with the
        job's hand-back records, shared by its runners on this daemon."""
        records = self._records.for_job(job_id, self._links, job.result_log)
        return open_job_pipes(self._links, job, window, records)
