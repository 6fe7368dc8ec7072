"""A client process for the per-key order crash test: submits keyed tasks, then takes outcomes.

Usage: ``keys_client_proc.py ADDRESS JOURNAL_DIR LOG KEYS PER_KEY``

Creates a job of ``tests.handlers.ordered:run``, submits ``PER_KEY`` tasks of each of ``KEYS``
keys (round-robin), closes it, and takes outcomes. Prints ``job <id>``, then ``got <key> <seq>``
for each outcome as it comes (it is taken when the next is asked for), flushed. The test kills
it with SIGKILL somewhere in the middle.
"""

from __future__ import annotations

import asyncio
import sys

from truba.client import Client


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(address: str, journal: str, log: str, keys: int, per_key: int) -> None:
    async with Client(address, journal=journal) as client:
        job = await client.create_job("tests.handlers.ordered:run", name="keys-crash")
        say(f"job {job.id}")
        for seq in range(per_key):
            for k in range(keys):
                await job.submit([log, f"k{k}", seq, 0.005], key=f"k{k}")
        await job.close()
        async for outcome in job.results():
            key, seq, _, _ = outcome.result()
            say(f"got {key} {seq}")
        await asyncio.sleep(3600)  # killed before this ends


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
