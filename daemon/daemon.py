"""The compute daemon: S slot processes, lent to jobs as the scheduler assigns them.

The daemon keeps the scheduler's latest assignment (slots per job) as its desired state and
reconciles towards it whenever something changes: a runner per assigned job, each with as many
workers as it has slots, every worker holding one slot process. Reassignment is graceful here: a
worker leaves its job after its current task and its slot goes to the job that needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field

from truba.daemon.allow import is_allowed
from truba.daemon.control import SchedulerLink
from truba.daemon.runner import JobRunner
from truba.daemon.slots import SlotProcess
from truba.pipes.base import Listener, Sender
from truba.pipes.prefetch import Window
from truba.pipes.rabbit import RabbitBroker, redact
from truba.pipes.stacks import listen_stack, send_stack
from truba.proto.v1 import daemons_pb2
from truba.wire import ResultCodec, ResultMessage, TaskCodec, TaskMessage

log = logging.getLogger(__name__)
REOPEN_DELAY = 1.0


@dataclass
class DaemonConfig:
    """How a daemon runs. ``allow`` holds fnmatch patterns over ``module:function``."""

    scheduler: str
    slots: int
    allow: list[str]
    daemon_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    broker_heartbeat: float = 10.0


@dataclass(frozen=True)
class Wanted:
    """One job of the scheduler's assignment."""

    handler: str
    slots: int
    tasks_queue: str
    results_queue: str
    dead_queue: str


class Daemon:
    """Runs assigned jobs on its slots; see the module docstring."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.link = SchedulerLink(config.scheduler, self)
        self._slots = [SlotProcess(i) for i in range(config.slots)]
        self._free: list[SlotProcess] = list(self._slots)
        self._brokers: list[str] = []
        self._links: list[RabbitBroker] = []
        self._wanted: dict[str, Wanted] = {}
        self._version = 0
        self._runners: dict[str, JobRunner] = {}
        self._retry_at: dict[str, float] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()

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
        stats = [
            daemons_pb2.JobStats(
                job_id=job_id, done=r.stats.done, failed=r.stats.failed, busy_slots=r.stats.busy
            )
            for job_id, r in self._runners.items()
        ]
        return daemons_pb2.Heartbeat(applied_version=self._version, running=self._running(), stats=stats)

    def _running(self) -> list[daemons_pb2.JobSlots]:
        return [
            daemons_pb2.JobSlots(job_id=job_id, handler=r.handler, slots=r.active)
            for job_id, r in self._runners.items()
        ]

    def welcome(self, welcome: daemons_pb2.Welcome) -> None:
        brokers = [b.url for b in welcome.brokers]
        if brokers != self._brokers:
            log.info("daemon.brokers", extra={"brokers": [redact(u) for u in brokers]})
            self._brokers = brokers
            name = f"truba-daemon-{self.config.daemon_id}"
            # Links to brokers no longer listed close with their runners' pipes; new ones start lazily.
            self._links = [
                RabbitBroker(url, name=name, heartbeat=self.config.broker_heartbeat) for url in brokers
            ]
            self._changed.set()

    def assign(self, assignment: daemons_pb2.Assignment) -> None:
        wanted: dict[str, Wanted] = {}
        for job in assignment.jobs:
            if not is_allowed(job.handler, self.config.allow):
                # The scheduler should never do this; the daemon is the security boundary anyway.
                log.error("daemon.job.refused", extra={"job_id": job.job_id, "handler": job.handler})
                continue
            wanted[job.job_id] = Wanted(
                job.handler, job.slots, job.queues.tasks, job.queues.results, job.queues.dead
            )
        log.info(
            "daemon.assigned",
            extra={"version": assignment.version, "jobs": {j: w.slots for j, w in wanted.items()}},
        )
        self._wanted = wanted
        self._version = assignment.version
        self._changed.set()

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Runs until :meth:`stop`; then finishes running tasks and closes everything."""
        log.info(
            "daemon.starting",
            extra={
                "daemon_id": self.config.daemon_id,
                "slots": self.config.slots,
                "allow": self.config.allow,
            },
        )
        await asyncio.gather(*(slot.start() for slot in self._slots))
        link = asyncio.create_task(self.link.run(self._stop))
        try:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 1.0)
                self._changed.clear()
                if not self._stop.is_set():
                    await self._reconcile()
        finally:
            await self._shutdown(link)

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()

    async def _shutdown(self, link: asyncio.Task[None]) -> None:
        log.info("daemon.stopping", extra={"running": list(self._runners)})
        await asyncio.gather(*(r.close() for r in self._runners.values()), return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.gather(*(slot.stop() for slot in self._slots), return_exceptions=True)
        await asyncio.gather(*(link.close() for link in self._links), return_exceptions=True)
        await link
        log.info("daemon.stopped")

    # -- reconciliation ------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        for job_id, runner in list(self._runners.items()):
            wanted = self._wanted.get(job_id)
            runner.target = wanted.slots if wanted is not None else 0
            if runner.target > 0:
                await runner.window.resize(_window_for(runner.target))
            if runner.failure is not None or runner.target == 0:
                if runner.failure is not None:
                    log.warning("daemon.job.reopen", extra={"job_id": job_id, "error": repr(runner.failure)})
                    self._retry_at[job_id] = time.monotonic() + REOPEN_DELAY
                del self._runners[job_id]
                self._close_later(runner)
        for job_id, wanted in self._wanted.items():
            if job_id not in self._runners and wanted.slots > 0 and self._brokers:
                if time.monotonic() >= self._retry_at.get(job_id, 0.0):
                    self._open_runner(job_id, wanted)
        for runner in self._runners.values():
            while runner.active < runner.target and self._free:
                runner.add_worker(self._free.pop())

    def _close_later(self, runner: JobRunner) -> None:
        task = asyncio.create_task(runner.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _release(self, slot: SlotProcess) -> None:
        self._free.append(slot)
        self._changed.set()

    def _open_runner(self, job_id: str, wanted: Wanted) -> None:
        window = Window(_window_for(wanted.slots))
        tasks, results = self._open_pipes(wanted, window)
        self._runners[job_id] = JobRunner(
            job_id, wanted.handler, self.config.daemon_id, tasks, results, self._release, wanted.slots, window
        )
        log.info(
            "daemon.job.opened", extra={"job_id": job_id, "handler": wanted.handler, "slots": wanted.slots}
        )

    def _open_pipes(
        self, wanted: Wanted, window: Window
    ) -> tuple[Listener[TaskMessage], Sender[ResultMessage]]:
        """The job's task listener and result sender (see truba.pipes.stacks); they connect lazily."""
        tasks = listen_stack(
            TaskCodec(),
            self._links,
            wanted.tasks_queue,
            window,
            role="tasks",
            dead_letter_queue=wanted.dead_queue,
        )
        results = send_stack(ResultCodec(), self._links, wanted.results_queue, role="results")
        return tasks, results


def _window_for(slots: int) -> int:
    """Prefetch per broker: twice the slots, so a slot computes while the last result is confirmed."""
    return max(1, 2 * slots)
