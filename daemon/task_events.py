"""What a daemon tells about each task's life: per-task log events and the job's metrics.

One :class:`TaskEvents` per job's runner, called where the life happens
(:mod:`truba.daemon.execution`, :mod:`truba.daemon.task_endings`). A task's life on the daemon
side is five events, each carrying ``job_id``, ``task_id``, ``daemon_id`` and ``slot`` (bound by
the worker, see :func:`truba.logs.bind`):

- ``daemon.task.received``: a worker took its delivery (``redelivered``, ``attempts``);
- ``daemon.task.started``: its attempt was handed to the slot (``attempt``, ``pid``, ``handed``:
  tasks in the same hand-over, several for a chunk or a batch);
- ``daemon.task.ended``: the attempt ended (``how``: an outcome of
  :data:`~truba.daemon.metrics.OUTCOMES`, ``seconds`` on the slot, ``attempt``);
- ``daemon.task.confirmed``: what it published for it (a result, a requeue, a give-up) was
  confirmed (``what``, ``confirm_seconds``);
- ``daemon.task.acked``: its delivery was acked (``what``), or ``daemon.task.rejected``: its
  confirm failed and the delivery went back to the broker.

**At debug** every task's events are written as they happen. **At info** (the default) writing
five lines per task would cost W1 about half its throughput (``bench/daemon_logging.py``), so
the life is *buffered*: its events are kept in memory, unformatted, and written together (each
with the time it happened) once the task is settled here, only for a task whose life was
troubled (an attempt that did not end ``ok``, a requeue, a give-up, a rejected confirm), for
every task whose attempt took :data:`LONG_ATTEMPT` or more, and for one short ok task in
:data:`SAMPLE_EVERY`, chosen by its id (:func:`sampled`: the same tasks on every daemon). Above
info nothing is kept. The metrics (a histogram sample and a counter per attempt)
are always on.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Final, final

from truba.daemon.handover import Admitted
from truba.daemon.metrics import JobMeter
from truba.daemon.slot_process import SlotProcess
from truba.daemon.supervise import Ending

log = logging.getLogger(__name__)

SAMPLE_EVERY: Final = 128
"""At info, the life of one short ok task in this many is written."""
LONG_ATTEMPT: Final = 0.1
"""Seconds: at info, the life of a task whose attempt held its slot this long is always written
(five lines cost it well under 1 %; sampling is for short tasks, where they would cost most)."""
LIVES_KEPT: Final = 4096
"""At info, lives buffered at most per runner (the oldest is dropped past it: a bound, never
reached while tasks settle, since each life is written or dropped when its task is)."""
RESTART_REASONS: Final = {
    Ending.DIED: "crashed",
    Ending.TIMED_OUT: "timeout",
    Ending.OUT_OF_MEMORY: "out_of_memory",
    Ending.INTERRUPTED: "interrupted",
}
"""Why a slot was started afresh, by how the attempt on it ended (a reply keeps the slot)."""

Event = tuple[str, float, dict[str, object]]
"""A buffered event: its name, when (Unix seconds), its fields."""


def sampled(task_id: str) -> bool:
    """Whether the life of ``task_id`` is written at info even if short and ok (one in
    :data:`SAMPLE_EVERY`)."""
    return zlib.crc32(task_id.encode()) % SAMPLE_EVERY == 0


@final
class _Life:
    """One task's buffered events, and whether they are to be written whether sampled or not
    (something went wrong, or the attempt was long)."""

    __slots__ = ("events", "keep")

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.keep = False


@final
class TaskEvents:
    """Logs each task's life and updates its job's metrics; see the module docstring."""

    def __init__(self, meter: JobMeter | None = None) -> None:
        self.meter = meter
        self._lives: dict[str, _Life] = {}

    # -- the life --------------------------------------------------------------------------------

    def received(self, task_id: str, redelivered: bool, attempts: int) -> None:
        """A worker took the task's delivery (its id is bound)."""
        self._tell(task_id, "daemon.task.received", {"redelivered": redelivered, "attempts": attempts})

    def started(self, slot: SlotProcess, admitted: list[Admitted]) -> None:
        """The admitted tasks were handed to ``slot`` (a lone task's id is bound already)."""
        if not log.isEnabledFor(logging.INFO):
            return
        handed = len(admitted)
        for delivery, spent in admitted:
            task_id = delivery.message.task_id
            fields: dict[str, object] = {"attempt": spent + 1, "pid": slot.pid, "handed": handed}
            if handed > 1:
                fields["task_id"] = task_id
            self._tell(task_id, "daemon.task.started", fields)

    def ended(self, task_id: str, how: str, seconds: float, attempt: int) -> None:
        """The task's attempt ended ``how`` (an outcome) after ``seconds`` on its slot."""
        if self.meter is not None:
            self.meter.ended(how, seconds)
        fields: dict[str, object] = {"how": how, "seconds": round(seconds, 6), "attempt": attempt}
        self._tell(task_id, "daemon.task.ended", fields, keep=how != "ok" or seconds >= LONG_ATTEMPT)

    def confirmed(self, task_id: str, what: str, seconds: float) -> None:
        """What was published for the task was confirmed (call in the task's log context)."""
        fields: dict[str, object] = {"what": what, "confirm_seconds": round(seconds, 6)}
        self._tell(task_id, "daemon.task.confirmed", fields, keep=what != "result")

    def settled(self, task_id: str, what: str, *, acked: bool) -> None:
        """The task's delivery was acked (or rejected): its life here is over, and at info it is
        written now if it is to be kept or sampled (call in the task's log context)."""
        event = "daemon.task.acked" if acked else "daemon.task.rejected"
        self._tell(task_id, event, {"what": what}, keep=not acked)
        life = self._lives.pop(task_id, None)
        if life is not None and (life.keep or sampled(task_id)):
            for name, at, fields in life.events:
                record = log.makeRecord(log.name, logging.INFO, __file__, 0, name, (), None, extra=fields)
                record.created, record.msecs = at, (at - int(at)) * 1000
                log.handle(record)

    def _tell(self, task_id: str, event: str, fields: dict[str, object], *, keep: bool = False) -> None:
        life = self._lives.get(task_id)
        if life is not None:  # buffered since its first event (info): the common case, kept short
            life.events.append((event, time.time(), fields))
            if keep:
                life.keep = True
        elif log.isEnabledFor(logging.DEBUG):
            log.debug(event, extra=fields)
        elif log.isEnabledFor(logging.INFO):
            if len(self._lives) >= LIVES_KEPT:
                del self._lives[next(iter(self._lives))]
            life = self._lives[task_id] = _Life()
            life.events.append((event, time.time(), fields))
            life.keep = keep

    # -- the metrics alone -------------------------------------------------------------------------

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
