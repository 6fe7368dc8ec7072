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

import contextvars
import logging
import time
import zlib
from collections.abc import Callable
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

Event = tuple[str, float, tuple[str, ...], tuple[object, ...]]
"""A buffered event: its name, when (Unix seconds), its fields' names and values (the record's
fields are built only if it is written: most lives are dropped)."""

RECEIVED: Final = ("redelivered", "attempts")
STARTED: Final = ("attempt", "pid", "handed")
ENDED: Final = ("how", "seconds", "attempt")
CONFIRMED: Final = ("what", "confirm_seconds")
SETTLED: Final = ("what",)


def sampled(task_id: str) -> bool:
    """Whether the life of ``task_id`` is written at info even if short and ok (one in
    :data:`SAMPLE_EVERY`)."""
    return zlib.crc32(task_id.encode()) % SAMPLE_EVERY == 0


@final
class _Life:
    """One task's buffered events, and whether they are to be written whether sampled or not
    (something went wrong, or the attempt was long)."""

    __slots__ = ("events", "keep")

    def __init__(self, event: Event, keep: bool) -> None:
        self.events: list[Event] = [event]
        self.keep = keep


@final
class TaskEvents:
    """Logs each task's life and updates its job's metrics; see the module docstring.

    Each event names its task (``task_id`` among its fields): a task's ids need not be bound
    where its events are told. The other ids (the slot, the job) come from the log context: a
    task's last events are told by the acker, in the context its end was published in (see
    :meth:`confirmed` and :meth:`settled`).
    """

    def __init__(self, meter: JobMeter | None = None) -> None:
        self.meter = meter
        self._lives: dict[str, _Life] = {}

    # -- the life --------------------------------------------------------------------------------

    def received(self, task_id: str, redelivered: bool, attempts: int) -> None:
        """A worker took the task's delivery."""
        self._tell(task_id, "daemon.task.received", RECEIVED, (redelivered, attempts))

    def started(self, slot: SlotProcess, admitted: list[Admitted]) -> None:
        """The admitted tasks were handed to ``slot``."""
        if not log.isEnabledFor(logging.INFO):
            return
        handed, pid = len(admitted), slot.pid
        for delivery, spent in admitted:
            self._tell(delivery.message.task_id, "daemon.task.started", STARTED, (spent + 1, pid, handed))

    def ended(self, task_id: str, how: str, seconds: float, attempt: int) -> None:
        """The task's attempt ended ``how`` (an outcome) after ``seconds`` on its slot."""
        if self.meter is not None:
            self.meter.ended(how, seconds)
        keep = how != "ok" or seconds >= LONG_ATTEMPT
        self._tell(task_id, "daemon.task.ended", ENDED, (how, seconds, attempt), keep)

    def confirmed(
        self, task_id: str, what: str, seconds: float, context: contextvars.Context | None = None
    ) -> None:
        """What was published for the task was confirmed; ``context``: the log context its end
        was published in (at debug the event is written in it)."""
        fields = (what, seconds)
        life = self._lives.get(task_id)
        if life is not None:  # buffered (info): the common case, kept short
            life.events.append(("daemon.task.confirmed", time.time(), CONFIRMED, fields))
            if what != "result":
                life.keep = True
        else:
            _in(context, self._tell, task_id, "daemon.task.confirmed", CONFIRMED, fields, what != "result")

    def settled(
        self, task_id: str, what: str, *, acked: bool, context: contextvars.Context | None = None
    ) -> None:
        """The task's delivery was acked (or rejected): its life here is over, and at info it is
        written now (in ``context``, as :meth:`confirmed`) if it is to be kept or sampled."""
        event = "daemon.task.acked" if acked else "daemon.task.rejected"
        life = self._lives.pop(task_id, None)
        if life is None:  # not buffered: at debug it is written now, at info it is a life of its own
            if log.isEnabledFor(logging.DEBUG):
                _in(context, _debug, event, _fields(task_id, SETTLED, (what,)))
                return
            if not log.isEnabledFor(logging.INFO):
                return
            life = _Life((event, time.time(), SETTLED, (what,)), False)
        else:
            life.events.append((event, time.time(), SETTLED, (what,)))
        if life.keep or not acked or sampled(task_id):  # else a short ok life, dropped
            _in(context, _write, task_id, life.events)

    def _tell(
        self, task_id: str, event: str, names: tuple[str, ...], values: tuple[object, ...], keep: bool = False
    ) -> None:
        life = self._lives.get(task_id)
        if life is not None:  # buffered since its first event (info): the common case, kept short
            life.events.append((event, time.time(), names, values))
            if keep:
                life.keep = True
        elif log.isEnabledFor(logging.DEBUG):
            log.debug(event, extra=_fields(task_id, names, values))
        elif log.isEnabledFor(logging.INFO):
            if len(self._lives) >= LIVES_KEPT:
                del self._lives[next(iter(self._lives))]
            self._lives[task_id] = _Life((event, time.time(), names, values), keep)

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


def _in(context: contextvars.Context | None, call: Callable[..., None], *args: object) -> None:
    """``call(*args)`` in ``context`` (None: the current one)."""
    if context is None:
        call(*args)
    else:
        context.run(call, *args)


def _debug(event: str, fields: dict[str, object]) -> None:
    log.debug(event, extra=fields)


def _fields(task_id: str, names: tuple[str, ...], values: tuple[object, ...]) -> dict[str, object]:
    """An event's fields as a record carries them (seconds rounded to the microsecond)."""
    fields: dict[str, object] = {"task_id": task_id}
    for name, value in zip(names, values, strict=True):
        fields[name] = round(value, 6) if isinstance(value, float) else value
    return fields


def _write(task_id: str, events: list[Event]) -> None:
    """Writes a buffered life at info, each event with the time it happened."""
    for name, at, names, values in events:
        record = log.makeRecord(
            log.name, logging.INFO, __file__, 0, name, (), None, extra=_fields(task_id, names, values)
        )
        record.created, record.msecs = at, (at - int(at)) * 1000
        log.handle(record)
