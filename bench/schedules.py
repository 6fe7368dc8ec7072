"""Periodic schedules: how many runs a 1 s schedule makes in a minute, and how late they start.

One local broker, a scheduler and one daemon (``bench/local.py``). A schedule fires
``tests.handlers.periodic:record`` every ``--every`` seconds for ``--seconds``; the handler appends
its start time to a file. Reported:

- runs started in the window of due times ``[first due, first due + seconds)`` (a 1 s schedule
  must make 58-62 in a minute);
- gap jitter: ``|start-to-start gap - every|`` over consecutive runs (p50, p99, max);
- fire lateness: when the scheduler sent each run minus when it was due (``ScheduleRun.started
  - due``), and start lateness: when the handler started minus when it was due (p50, p99, max).

    python bench/schedules.py [--seconds 60] [--every 1.0] [--sleep 0.2] [--json bench/results/schedules.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from local import one_daemon_cluster
from report import percentile, write_json

ROOT = Path(__file__).resolve().parent.parent


async def measure(
    address: str, record: Path, seconds: float, every: float, sleep: float
) -> dict[str, object]:
    from truba.client import Client

    async with Client(address, journal=False) as client:
        schedule = await client.create_schedule(
            "tests.handlers.periodic:record", every=every, payload={"path": str(record), "sleep": sleep}
        )
        await asyncio.sleep(seconds + 2 * every)
        runs = await schedule.runs()
        await schedule.delete()
    starts = [float(line.split()[1]) for line in record.read_text().splitlines() if line.startswith("S ")]
    first = min(run.due for run in runs)  # the window is of due times: [first due, + seconds)
    window = [at for at in starts if first <= at < first + seconds]
    gaps = [abs((b - a) - every) for a, b in zip(window, window[1:], strict=False)]
    ended = [run for run in runs if run.outcome != "running"]
    fired = [run.started - run.due for run in ended]
    began = [run.ended - run.duration - run.due for run in ended if run.duration]
    return {
        "seconds": seconds,
        "every": every,
        "runs": len(window),
        "outcomes": sorted({run.outcome for run in ended}),
        "gap_jitter": _stats(gaps),
        "fire_late": _stats(fired),
        "start_late": _stats(began),
    }


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 4),
        "p99": round(percentile(values, 99), 4),
        "max": round(max(values), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each run takes")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "schedules.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with one_daemon_cluster("truba-bench-schedules-", slots=2) as bench:
        result = asyncio.run(
            measure(bench.cluster.address, bench.tmp / "runs.txt", args.seconds, args.every, args.sleep)
        )
    runs, outcomes = result["runs"], result["outcomes"]
    print(f"{runs} runs in {args.seconds:g} s at every={args.every:g} s; outcomes {outcomes}")
    for key in ("gap_jitter", "fire_late", "start_late"):
        stats = result[key]
        assert isinstance(stats, dict)
        print(f"  {key:<11} p50 {stats['p50']:.4f} s   p99 {stats['p99']:.4f} s   max {stats['max']:.4f} s")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
