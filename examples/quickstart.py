"""The SDK in a page: the same job with the async client and with the blocking one.

Run against a local cluster (``truba up`` prints the scheduler's address and sets
``$TRUBA_SCHEDULER`` for the command after ``--``)::

    truba up --allow 'examples.*' -- python -m examples.quickstart
    truba up --allow 'examples.*' -- python -m examples.quickstart --blocking
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import truba

CHUNKS = [[lo, lo + 100_000] for lo in range(0, 1_000_000, 100_000)]


async def run_async(address: str) -> int:
    """Submit, close, then take each outcome as it arrives."""
    async with truba.Client(address) as client:
        job = await client.create_job("examples.primes:count", importance=2.0, name="quickstart")
        for chunk in CHUNKS:
            await job.submit(chunk)
        await job.close()  # no more tasks: the job ends when every outcome is in
        total = 0
        async for outcome in job.results():  # exactly one outcome per task, as they arrive
            total += int(outcome.result())  # type: ignore[call-overload]  # raises TaskFailed
    return total


def run_blocking(address: str) -> int:
    """``map``: submit, close and yield the outcomes in order, with a progress bar on a terminal."""
    with truba.connect(address) as client:
        job = client.create_job("examples.primes:count", name="quickstart-blocking")
        return sum(int(outcome.result()) for outcome in job.map(CHUNKS))  # type: ignore[call-overload]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", default=os.environ.get("TRUBA_SCHEDULER", "127.0.0.1:50051"))
    parser.add_argument("--blocking", action="store_true", help="use the blocking client")
    args = parser.parse_args(argv)
    total = run_blocking(args.scheduler) if args.blocking else asyncio.run(run_async(args.scheduler))
    print(f"primes below 1,000,000: {total:,}")
    return 0 if total == 78_498 else 1


if __name__ == "__main__":
    sys.exit(main())
