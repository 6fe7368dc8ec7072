"""The workers lent to one job on one daemon: how many stay, which leave, which are interrupted.

The number of workers follows ``target`` (slots the scheduler assigned). Idle workers leave at
once when it drops. Busy workers leave after their task (graceful preemption), or, for a job
with immediate preemption, are interrupted: the slot is killed and restarted, the task goes back
to its queue without spending an attempt (see :mod:`truba.daemon.execution`), and the slot is
free within milliseconds. A graceful job may bound the wait (``preemption_grace``): the tasks of
slots taken from it that still run that many seconds later are interrupted as above.

The crew also knows why every worker stops: the runner closes, stops now, or a pipe broke
under it (``failure``: its owner reopens the runner).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from truba.daemon.slot_process import SlotProcess
from truba.daemon.supervise import Interrupt
from truba.pipes.errors import PipeError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Worker:
    """One slot lent to the job, and the state the runner steers it by."""

    slot: SlotProcess
    busy: bool = False
    leaving: bool = False
    started_at: float = 0.0
    wake: Interrupt = field(default_factory=Interrupt)
    """Wakes the worker from its wait for a delivery (a flag that calls back, as ``interrupt``)."""
    interrupt: Interrupt = field(default_factory=Interrupt)
    holds_results: bool = False
    """Its results wait for frames instead of going out alone (see
    :meth:`truba.daemon.runner.JobRunner._hold_results`)."""


class Crew:
    """The workers of one runner and the slot count they follow; see the module docstring."""

    def __init__(self, target: int, job_id: str = "") -> None:
        self.job_id = job_id
        self.target = target
        self.workers: dict[Worker, asyncio.Task[None]] = {}
        """Each worker with the task that runs it (see JobRunner._work)."""
        self.closing = False
        self.now = False
        """Stopping now: running tasks are interrupted, delivered ones go back unstarted."""
        self.failure: PipeError | None = None
        """The pipe error that stopped the runner (its owner reopens it)."""

    @property
    def staying(self) -> int:
        return sum(1 for w in self.workers if not w.leaving)

    def _over(self) -> bool:
        """More workers stay than the target (counted only when there are more workers than
        that: asked a few times per task, and counting them is the costly part)."""
        return len(self.workers) > self.target and self.staying > self.target

    def broke(self, exc: PipeError) -> None:
        """Notes the first pipe error: every worker leaves at its next turn."""
        if self.failure is None:
            self.failure = exc

    def going(self, worker: Worker) -> bool:
        """The worker will leave at its next turn (see leaves, which also marks it)."""
        return worker.leaving or self.closing or self.failure is not None or self._over()

    def leaves(self, worker: Worker) -> bool:
        """Whether the worker leaves now; one over the target is marked leaving."""
        if worker.leaving or self.closing or self.failure is not None:
            return True
        if self._over():
            worker.leaving = True
            return True
        return False

    def resize(self, target: int, interrupt: bool, grace: float | None = None) -> None:
        """Follows a new slot count: idle workers over it leave now; busy ones after their task,
        at once when ``interrupt``, or after their task but at most ``grace`` seconds from now."""
        self.target = target
        excess = self.staying - target
        if excess <= 0:
            return
        staying = [w for w in self.workers if not w.leaving]
        for worker in [w for w in staying if not w.busy][:excess]:
            worker.leaving = True
            worker.wake.set()
            excess -= 1
        if excess > 0 and interrupt:
            self._interrupt_newest(excess)
        elif excess > 0 and grace is not None:
            asyncio.get_running_loop().call_later(grace, self._grace_over, excess, grace)
        # Graceful: whichever busy worker finishes first leaves (see leaves).

    def _grace_over(self, taken: int, grace: float) -> None:
        """``grace`` passed since ``taken`` busy slots were taken: those still over the target
        are interrupted (fewer if tasks ended meanwhile or the target rose again)."""
        excess = min(taken, self.staying - self.target)
        if excess <= 0:  # (a runner closing because the job left: its tasks are over the target)
            return
        log.info(
            "daemon.preemption.grace_over",
            extra={"job_id": self.job_id, "grace": grace, "interrupted": excess, "target": self.target},
        )
        self._interrupt_newest(excess)

    def _interrupt_newest(self, count: int) -> None:
        """Interrupts the ``count`` most recently started tasks: they lose the least work."""
        busy = [w for w in self.workers if w.busy and not w.leaving]
        for worker in sorted(busy, key=lambda w: w.started_at, reverse=True)[:count]:
            worker.leaving = True
            worker.interrupt.set()

    def stop_now(self) -> None:
        """Every worker leaves; running tasks are interrupted."""
        self.closing = True
        self.now = True
        for worker in self.workers:
            worker.leaving = True
            worker.wake.set()
            worker.interrupt.set()

    def wake_idle(self) -> None:
        """Wakes the workers waiting for a delivery (closing: they leave at once)."""
        for worker in self.workers:
            if not worker.busy:
                worker.wake.set()
