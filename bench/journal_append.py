"""The client's cost to encode a task and write it to the job's journal, per payload size.

Each of ``--tasks`` tasks of ``--size`` bytes (random: no compression games) is encoded as the
client does (:class:`~truba.client.encoded.EncodedTask`) and recorded in a journal with fsync
``never`` (the disk's sync is not what is measured), then settled; the median, p10 and p90 in µs.

    python bench/journal_append.py [--tasks 500] [--size 1048576]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

from truba.client.encoded import EncodedTask
from truba.client.journal import Journal
from truba.pipes.crc import FAST
from truba.wire import TaskMessage


async def measure(tasks: int, size: int) -> list[float]:
    payload = os.urandom(size)
    took: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        journal = Journal.open(directory, fsync="never")
        try:
            for i in range(tasks):
                began = time.perf_counter()
                encoded = EncodedTask.of(TaskMessage(f"t{i}", payload))
                await journal.record(encoded.task_id, encoded.data)
                took.append((time.perf_counter() - began) * 1e6)
                journal.settle(encoded.task_id)
        finally:
            journal.close_now()
    return sorted(took)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--size", type=int, default=1 << 20)
    args = parser.parse_args()
    took = asyncio.run(measure(args.tasks, args.size))
    n = len(took)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{args.size} B encode + journal: median {statistics.median(took):.0f} µs, p10 {took[n // 10]:.0f}, "
        f"p90 {took[9 * n // 10]:.0f} (zlib-ng CRC: {FAST}; load average {load})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
