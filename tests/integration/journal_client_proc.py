"""A client process for the journal crash test: creates a job and submits numbered tasks.

Usage: ``journal_client_proc.py ADDRESS JOURNAL_DIR COUNT``

Prints ``job <id>`` once the job exists, then ``submitted i`` after each ``submit(i)`` returned,
flushed; it never takes outcomes. The test kills it with SIGKILL somewhere in the middle.
"""

from __future__ import annotations

import asyncio
import sys

from truba.client import Client


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(address: str, journal: str, count: int) -> None:
    async with Client(address, journal=journal) as client:
        job = await client.create_job("tests.handlers.basic:echo", name="journal-crash")
        say(f"job {job.id}")
        for i in range(count):
            await job.submit(i)
            say(f"submitted {i}")
        await asyncio.sleep(3600)  # killed before this ends


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
