"""Tracing mode: a monotonic timestamp at each hop of a task, for ``bench/latency.py``.

Off unless the environment variable ``TRUBA_TRACE`` names a folder (or :func:`start` is called):
then every process of truba (client, daemon, slots) keeps ``(hop, task id, time)`` records in
memory, the time from ``CLOCK_MONOTONIC`` (one clock for every process of a Linux machine, so
hops of one task compare across processes), and writes them to ``<folder>/<pid>.trace`` (one
line each: ``hop task_id nanoseconds``) every :data:`FLUSH_EVERY` records and at exit.

A hop is named after where it is: ``client.submit``, ``tasks.publish`` (the sending leaf hands
the message to the broker connection), ``tasks.confirm``, ``tasks.deliver`` (the listening leaf
got it), ``daemon.taken`` (a worker took it), ``slot.write``, ``slot.start``/``slot.done`` (in
the slot process), ``slot.reply``, ``results.publish``, ``results.confirm``, ``tasks.ack``,
``results.deliver``, ``client.outcome``, ``results.ack``. Off, a call site costs one attribute
read (``if trace.enabled:``); on, a record costs about a microsecond.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import Final

__all__ = ["FLUSH_EVERY", "enabled", "flush", "mark", "mark_body", "start", "task_id_of"]

ENV: Final = "TRUBA_TRACE"
FLUSH_EVERY: Final = 4096
FRAME_MAGIC: Final = b"\xc1TF1"
""":data:`truba.pipes.frame_format.MAGIC` (not imported: this module imports nothing of truba's)."""

enabled = False
"""Whether hops are recorded (read at every call site: keep it a module attribute)."""
_folder: str | None = None
_records: list[tuple[str, str, int]] = []


def start(folder: str | os.PathLike[str]) -> None:
    """Records hops from now on, into ``folder`` (also for child processes started after)."""
    global enabled, _folder
    _folder = os.fspath(folder)
    os.makedirs(_folder, exist_ok=True)
    os.environ[ENV] = _folder
    if not enabled:
        atexit.register(flush)
    enabled = True


def mark(hop: str, task_id: str) -> None:
    """Records that ``task_id`` passed ``hop`` now."""
    _records.append((hop, task_id, time.monotonic_ns()))
    if len(_records) >= FLUSH_EVERY:
        flush()


def mark_body(hop: str, body: bytes | bytearray | memoryview) -> None:
    """Records ``hop`` for the task a message is about (a task or a result: both start with
    ``[1, task_id, ...]``), or for each member of a frame."""
    now = time.monotonic_ns()
    data = bytes(body[:64]) if not bytes(body[:4]) == FRAME_MAGIC else bytes(body)
    if data.startswith(FRAME_MAGIC):
        import msgpack  # tracing only

        try:
            members = msgpack.unpackb(data[len(FRAME_MAGIC) :])
        except Exception:
            return
        for member in members if isinstance(members, list) else ():
            task_id = task_id_of(member) if isinstance(member, bytes) else None
            if task_id is not None:
                _records.append((hop, task_id, now))
    else:
        task_id = task_id_of(data)
        if task_id is not None:
            _records.append((hop, task_id, now))
    if len(_records) >= FLUSH_EVERY:
        flush()


def task_id_of(data: bytes) -> str | None:
    """The task id of a task or result message, read from its head (None: not one)."""
    if len(data) < 3 or not 0x92 <= data[0] <= 0x9F or data[1] != 1:
        return None
    lead = data[2]
    if 0xA0 <= lead <= 0xBF:
        start, size = 3, lead - 0xA0
    elif lead == 0xD9 and len(data) > 3:
        start, size = 4, data[3]
    else:
        return None
    try:
        return data[start : start + size].decode()
    except UnicodeDecodeError:
        return None


def flush() -> None:
    """Appends the records kept so far to this process's file."""
    if not _records or _folder is None:
        return
    records = _records[:]
    _records.clear()
    lines = "".join(f"{hop} {task_id} {ns}\n" for hop, task_id, ns in records)
    with open(os.path.join(_folder, f"{os.getpid()}.trace"), "a") as file:
        file.write(lines)


def _from_environment() -> None:
    folder = os.environ.get(ENV)
    if folder:
        start(folder)


_from_environment()
