"""A client process for the group crash test: a job with two groups, killed mid-way.

Usage: ``group_client_proc.py ADDRESS JOURNAL_DIR``

Makes group ``small`` (5 quick tasks) and group ``big`` (200 tasks of 20 ms), closes both, and
prints ``job <id>``, then ``fired small`` when small's callback ran and ``half big`` once big has
half its outcomes, flushed. The test kills it with SIGKILL after that.
"""

from __future__ import annotations

import asyncio
import sys

from truba.client import Client

BIG = 200


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(address: str, journal: str) -> None:
    async with Client(address, journal=journal) as client:
        job = await client.create_job("tests.handlers.basic:behave", name="group-crash")
        say(f"job {job.id}")
        small, big = job.group("small"), job.group("big")
        for n in range(5):
            await small.submit(["ok", n])
        await small.close()
        small.on_done(lambda outcomes: say("fired small"))
        for n in range(BIG):
            await big.submit(["sleep", 0.02] if n % 10 else ["raise", f"bad {n}"])
        await big.close()
        big.on_done(lambda outcomes: say("fired big"))  # killed before: it fires after the resume
        async with asyncio.timeout(120):
            while len(big.outcomes()) < BIG // 2:
                await asyncio.sleep(0.01)
        say("half big")
        await asyncio.sleep(3600)  # killed before this ends


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
