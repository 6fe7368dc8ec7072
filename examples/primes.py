"""Count the primes below N on a truba cluster, in chunks, and check the answer.

Handler: ``examples.primes:count`` takes ``[lo, hi]`` and returns how many primes lie in
``[lo, hi)`` (a segmented sieve over the chunk). Run against a local cluster::

    truba up --allow 'examples.*' -- python -m examples.primes --limit 10000000 --chunk 100000
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

KNOWN = {10**4: 1229, 10**5: 9592, 10**6: 78498, 10**7: 664579, 10**8: 5761455}


def count(span: list[int]) -> int:
    """Primes in ``[lo, hi)``: a segmented sieve of Eratosthenes."""
    lo, hi = int(span[0]), int(span[1])
    if hi <= 2:
        return 0
    lo = max(lo, 2)
    root = math.isqrt(hi - 1)
    small = bytearray([1]) * (root + 1)
    small[0:2] = b"\x00\x00"
    for i in range(2, math.isqrt(root) + 1):
        if small[i]:
            small[i * i :: i] = bytes(len(small[i * i :: i]))
    segment = bytearray([1]) * (hi - lo)
    for p in range(2, root + 1):
        if small[p]:
            start = max(p * p, (lo + p - 1) // p * p)
            segment[start - lo :: p] = bytes(len(segment[start - lo :: p]))
    return sum(segment)


def main(argv: list[str] | None = None) -> int:
    import truba

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", default=os.environ.get("TRUBA_SCHEDULER", "127.0.0.1:50051"))
    parser.add_argument("--limit", type=int, default=10**7)
    parser.add_argument("--chunk", type=int, default=100_000)
    args = parser.parse_args(argv)

    chunks = [[lo, min(lo + args.chunk, args.limit)] for lo in range(0, args.limit, args.chunk)]
    began = time.perf_counter()
    with truba.connect(args.scheduler) as client:
        job = client.create_job(handler="examples.primes:count", importance=1.0, name="primes")
        outcomes = list(job.map(chunks))
    seconds = time.perf_counter() - began
    failed = [o for o in outcomes if not o.ok]
    for outcome in failed:
        print(f"task {outcome.task_id} failed: {outcome.error}", file=sys.stderr)
    total = sum(int(o.value) for o in outcomes if o.ok)  # type: ignore[call-overload]
    print(f"job {job.id}: {len(outcomes)} tasks in {seconds:.2f} s ({len(outcomes) / seconds:.0f} tasks/s)")
    print(f"primes below {args.limit:,}: {total:,}")
    expected = KNOWN.get(args.limit)
    if expected is not None:
        print("matches the known value" if total == expected else f"WRONG: expected {expected:,}")
        return 0 if total == expected and not failed else 1
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
