"""aio-pika's and aiormq's own log records are kept at debug: truba tells the same faults once,
translated (:func:`~truba.pipes.rabbit.errors.map_amqp_errors`), with its own event names.

Without this, a broker going away makes aiormq log ``error when creating transport`` at every
reconnect try and ``Unexpected connection close`` with a traceback; an application that
configured no logging sees them on stderr through Python's last-resort handler. Expected faults
of the transport belong at debug (aio-pika's own advice for its users).
"""

from __future__ import annotations

import logging
from typing import Final

LOGGERS: Final = ("aiormq", "aiormq.connection", "aiormq.channel", "aiormq.base", "aio_pika")


class ToDebug(logging.Filter):
    """Lowers every record it sees to DEBUG (handlers' levels then decide, as for any debug record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno = logging.DEBUG
        record.levelname = "DEBUG"
        return True


TO_DEBUG: Final = ToDebug()


def quiet_amqp_logs() -> None:
    """Puts :data:`TO_DEBUG` on aio-pika's and aiormq's loggers (idempotent; call it once they
    are imported)."""
    names = {
        *LOGGERS,
        *(n for n in logging.root.manager.loggerDict if n.startswith(("aiormq.", "aio_pika."))),
    }
    for name in names:
        logger = logging.getLogger(name)
        if TO_DEBUG not in logger.filters:
            logger.addFilter(TO_DEBUG)
