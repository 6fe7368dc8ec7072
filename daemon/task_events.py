"""What a daemon tells about each task's life: per-task log events and the job's metrics.

One :class:`TaskEvents` per job's runner, called where the life happens
(:mod:`truba.daemon.execution`, :mod:`truba.daemon.task_endings`). A task's life on the daemon
side, as debug events that carry ``job_id``, ``task_id``, ``daemon_id`` and ``slot`` (bound by
the worker, see :func:`truba.logs.bind`):

- ``daemon.task.received``: a worker took its delivery (``redelivered``, ``attempts``);
- ``daemon.task.started``: its attempt was handed to the slot (``attempt``, ``pid``, ``handed``:
  tasks in the same hand-over, several for a chunk or a batch);
- ``daemon.task.ended``: the attempt ended (``how``: an outcome of
  :data:`~truba.daemon.metrics.OUTCOMES`, ``seconds`` on the slot, ``attempt``);
- ``daemon.task.confirmed``: what it published for it (a result, a requeue, a give-up) was
  confirmed (``what``, ``confirm_seconds``);
- ``daemon.task.acked``: its delivery was acked (``what``).

They are at debug because there are several per task: at the default level (info) each costs
one ``isEnabledFor`` check, and the metrics (a histogram sample and a counter per attempt) stay
on. What the life's info events already say (retried, preempted, timed out, slot died, gave up)
stays at info.
"""

from __future__ import annotations

import logging
from typing import Final, final

from truba.daemon.handover import Admitted
from truba.daemon.metrics import JobMeter
from truba.daemon.slot_process import SlotProcess
from truba.daemon.supervise import Ending

log = logging.getLogger(__name__)

RESTART_REASONS: Final = {
    Ending.DIED: "crashed",
    Ending.TIMED_OUT: "timeout",
    Ending.OUT_OF_MEMORY: "out_of_memory",
    Ending.INTERRUPTED: "interrupted",
}
"""Why a slot was started afresh, by how the attempt on it ended (a reply keeps the slot)."""


@final
class TaskEvents:
    """Logs each task's life and updates its job's metrics; see the module docstring."""

    def __init__(self, meter: JobMeter | None = None) -> None:
        self.meter = meter

    def started(self, slot: SlotProcess, admitted: list[Admitted]) -> None:
        """The admitted tasks were handed to ``slot`` (a lone task's id is bound already)."""
        if not log.isEnabledFor(logging.DEBUG):
            return
        handed = len(admitted)
        if handed == 1:
            fields: dict[str, object] = {"attempt": admitted[0][1] + 1, "pid": slot.pid, "handed": 1}
            log.debug("daemon.task.started", extra=fields)
            return
        for delivery, spent in admitted:
            fields = {
                "task_id": delivery.message.task_id,
                "attempt": spent + 1,
                "pid": slot.pid,
                "handed": handed,
            }
            log.debug("daemon.task.started", extra=fields)

    def ended(self, how: str, seconds: float, attempt: int) -> None:
        """The task's attempt ended ``how`` (an outcome) after ``seconds`` on its slot."""
        if self.meter is not None:
            self.meter.ended(how, seconds)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "daemon.task.ended", extra={"how": how, "seconds": round(seconds, 6), "attempt": attempt}
            )

    def gave_up(self) -> None:
        """The task was given up (its last attempt spent)."""
        if self.meter is not None:
            self.meter.gave_up()

    def slot_restarted(self, ending: Ending) -> None:
        """The slot was started afresh after an attempt that ended ``ending`` without a reply."""
        if self.meter is not None:
            self.meter.slot_restarted(RESTART_REASONS[ending])

    def slot_recycled(self, reason: str) -> None:
        """The slot was replaced after its tasks replied (``max_tasks`` or ``soft_memory``)."""
        if self.meter is not None:
            self.meter.slot_recycled(reason)
