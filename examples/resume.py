"""Crash in the middle of a job, and pick it up again: nothing is lost, nothing comes twice.

The client keeps each task in its journal (on disk) from ``submit`` until the application has
taken its outcome. After a crash, ``client.resume(job_id)`` sends again what no broker had
confirmed, waits for the rest, and ``job.submitted`` says where to go on from::

    truba up --allow 'examples.*' -- sh -c '
        python -m examples.resume --crash-after 300 --journal /tmp/j ;
        python -m examples.resume --journal /tmp/j --resume "$(cat /tmp/j/last-job)"'
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import truba

TASKS = 1000


def chunk(i: int) -> list[int]:
    return [i * 1000, (i + 1) * 1000]


async def run(address: str, journal: Path, resume: str | None, crash_after: int | None) -> int:
    async with truba.Client(address, journal=journal) as client:
        if resume is None:
            job = await client.create_job("examples.primes:count", name="resume-example")
            (journal / "last-job").write_text(job.id)
        else:
            job = await client.resume(resume)
            print(f"resumed job {job.id}: {job.submitted} tasks were in, {job.received} outcomes taken")
        for i in range(job.submitted, TASKS):  # the journal knows how far the last run got
            if crash_after is not None and i == crash_after:
                print(f"crashing after {i} tasks (job {job.id})", flush=True)
                os._exit(1)  # no cleanup at all, as with kill -9
            await job.submit(chunk(i))
        await job.close()
        total = 0
        async for outcome in job.results():
            total += int(outcome.result())  # type: ignore[call-overload]
    print(f"job {job.id}: {job.received} outcomes; primes below {TASKS * 1000:,} taken this run: {total:,}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", default=os.environ.get("TRUBA_SCHEDULER", "127.0.0.1:50051"))
    parser.add_argument("--journal", type=Path, required=True, help="the client's journal folder")
    parser.add_argument("--resume", metavar="JOB_ID", help="pick up this job from the journal")
    parser.add_argument("--crash-after", type=int, metavar="N", help="die after submitting N tasks")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.scheduler, args.journal, args.resume, args.crash_after))


if __name__ == "__main__":
    sys.exit(main())
