"""A sending process for the spool crash test: numbered messages through a spool over RabbitMQ.

Usage: ``spool_sender_proc.py URL QUEUE SPOOL_DIR COUNT [FSYNC]``

Prints, one line each, flushed:

- ``held i`` for every message the spool recovered from an earlier run, before replaying;
- ``spooled i`` once ``send(i)`` returned (the spool accepted it), never before;
- ``confirmed i`` once the broker confirmed ``i``;
- ``replayed n`` / ``done confirmed=n held=m`` at the end.

With COUNT 0 it only replays what the spool holds and waits for those confirms.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys

from truba.pipes.base import Confirmation
from truba.pipes.rabbit import RabbitConnection
from truba.pipes.spool import FsyncPolicy, SpoolSender, spool


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def report_confirm(number: int, confirmation: Confirmation) -> None:
    if not confirmation.cancelled() and confirmation.exception() is None:
        say(f"confirmed {number}")


async def main(url: str, queue: str, directory: str, count: int, fsync: FsyncPolicy) -> None:
    connection = await RabbitConnection.open(url, name=f"spool-crash-{os.getpid()}", heartbeat=5)
    sender = spool(directory, fsync=fsync)(await connection.sender(queue))
    assert isinstance(sender, SpoolSender)
    held = list(sender.unconfirmed())  # what the last run left, oldest first: replay sends these
    for message in held:
        say(f"held {message.decode()}")
    confirmations = []
    for confirmation, message in zip(await sender.replay(), held, strict=True):
        confirmation.add_done_callback(functools.partial(report_confirm, int(message)))
        confirmations.append(confirmation)
    say(f"replayed {sender.replayed}")
    for number in range(count):
        confirmation = await sender.send(str(number).encode())
        say(f"spooled {number}")
        confirmation.add_done_callback(functools.partial(report_confirm, number))
        confirmations.append(confirmation)
    results = await asyncio.gather(*confirmations, return_exceptions=True)
    confirmed = sum(1 for result in results if result is None)
    say(f"done confirmed={confirmed} held={len(sender.unconfirmed())}")
    await sender.close()
    await connection.close()


if __name__ == "__main__":
    url, queue, directory, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    fsync: FsyncPolicy = "batch"
    if len(sys.argv) > 5:
        assert sys.argv[5] in ("always", "batch", "interval", "never")
        fsync = sys.argv[5]  # type: ignore[assignment]
    asyncio.run(main(url, queue, directory, count, fsync))
