"""Structured logging for truba's binaries: one JSON object per line, ids from context.

Library code logs with ``logging.getLogger(__name__)``, a constant dotted event name as the message
and data in ``extra``. Binaries call :func:`setup` once, with the ``--log-level`` and
``--log-format`` that :func:`add_arguments` gives every command. Ids that hold for a whole scope
(job, task, daemon, slot) are bound with :func:`bind` and added to every record by a filter, so
layers need not thread them through calls.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import logging
import sys
import time
from typing import Final, TextIO

_CONTEXT: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("truba_log_context", default={})  # noqa: B039

# Attributes every LogRecord has; anything else came from `extra` and is printed as a field.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def bind(**fields: object) -> Bound:
    """Adds ``fields`` (e.g. ``job_id=...``) to every record logged in this context."""
    return Bound(fields)


class Bound:
    """The context manager of :func:`bind` (a class: daemons enter one per task)."""

    __slots__ = ("_fields", "_token")

    def __init__(self, fields: dict[str, object]) -> None:
        self._fields = fields
        self._token: contextvars.Token[dict[str, object]] | None = None

    def __enter__(self) -> None:
        self._token = _CONTEXT.set({**_CONTEXT.get(), **self._fields})

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _CONTEXT.reset(self._token)
            self._token = None


def bind_process(**fields: object) -> None:
    """Adds ``fields`` to every record of this process from now on (e.g. ``daemon_id``)."""
    _CONTEXT.set({**_CONTEXT.get(), **fields})


class ContextFilter(logging.Filter):
    """Copies the bound context fields onto each record (fields given in ``extra`` win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _CONTEXT.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def iso_time(created: float) -> str:
    """``created`` (Unix seconds) as ISO 8601 in UTC with microseconds: ``2026-11-25T12:00:00.123456Z``."""
    seconds = int(created)
    micros = int(round((created - seconds) * 1_000_000))
    if micros == 1_000_000:
        seconds, micros = seconds + 1, 0
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{micros:06d}Z"


class JsonFormatter(logging.Formatter):
    """``{"time": ISO 8601 UTC, "level": ..., "logger": ..., "event": ..., <fields>}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": iso_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info and record.levelno >= logging.DEBUG:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=repr, ensure_ascii=False)


_IDS: Final = ("job_id", "task_id", "daemon_id", "slot")
"""Fields a text line shows first, in this order, when a record has them."""


class TextFormatter(logging.Formatter):
    """For people: ``2026-11-25 12:00:00.123Z INFO  event  job_id=… field=…``, one record a line.

    The time is UTC to the millisecond (as in the JSON lines, so the two can be matched), the
    level padded to a column, then the event, the ids bound in context first and the other
    fields after, ``key=value`` with values that hold spaces or quotes in double quotes. A
    traceback, and the rest of a message of several lines (a library's), follow indented, so
    that a line starting at column 0 is always a new record.
    """

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            key: value
            for key, value in vars(record).items()
            if key not in _STANDARD and not key.startswith("_")
        }
        ordered = [key for key in _IDS if key in fields] + [key for key in fields if key not in _IDS]
        stamp = iso_time(record.created)[:23].replace("T", " ") + "Z"
        text = " ".join(f"{key}={_text_value(fields[key])}" for key in ordered)
        event, *more = record.getMessage().splitlines() or [""]
        if record.exc_info:
            more += self.formatException(record.exc_info).splitlines()
        line = f"{stamp} {record.levelname:<7} {event}  {text}".rstrip()
        return "\n".join([line, *("    " + row for row in more)])


def _text_value(value: object) -> str:
    """``value`` as it reads best: strings and numbers bare, others as repr; quoted when it has
    spaces, quotes or ``=`` (or is empty), so that every line splits back into its fields."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, int | float) else repr(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


LEVELS: Final = ("debug", "info", "warning", "error")
FORMATS: Final = ("json", "text")


def add_arguments(
    parser: argparse.ArgumentParser, *, level: str = "info", fmt: str = "json", note: str = ""
) -> None:
    """Adds ``--log-level`` and ``--log-format`` (with these defaults) to a command's ``parser``;
    ``note`` ends the help of both (e.g. where else they apply)."""
    parser.add_argument(
        "--log-level",
        default=level,
        choices=LEVELS,
        help=f"the least severe records logged, on stderr{note} (default: {level})",
    )
    parser.add_argument(
        "--log-format",
        default=fmt,
        choices=FORMATS,
        help="json: one JSON object a line (time, level, logger, event, fields), for machines; "
        f"text: one readable line a record (UTC time, level, event, key=value fields){note} (default: {fmt})",
    )


def setup(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Configures the root logger of a truba binary; call once at startup."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aio-pika/aiormq are chatty at info about things truba logs itself.
    for noisy in ("aio_pika", "aiormq"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
