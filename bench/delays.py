"""Delayed tasks (issue 16): how far from its due time each of 10,000 delayed tasks comes out.

Two measurements, in one run, on one local broker:

  levels     the delay levels alone: --tasks messages published by a delayed sender with
             delays spread evenly over 1..--spread seconds; the error is the arrival at a
             consumer of the target queue minus the due time
  job        a job end to end (scheduler, one daemon of --slots slots, journal on): --tasks
             ``submit(..., delay=d)`` with the same spread, run by a handler that returns when it
             started; the error is that start minus the due time (so it includes the slots the
             scheduler gives the job as the tasks fall due, and the daemon's queueing)

The table gives each one's error p50, p99 and worst (ms; a negative error is early), and how
many came out more than 1 s late or early.

    python bench/delays.py [--tasks 10000] [--spread 30] [--slots 2] [--json bench/results/delays.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from local import one_daemon_cluster
from report import percentile, write_json

from truba.client import Client
from truba.local.cluster import LocalCluster
from truba.local.node import LocalRabbitNode
from truba.pipes import delay
from truba.pipes.broker import QueueSpec
from truba.pipes.rabbit import RabbitBroker

HANDLER = "tests.handlers.timing:started_at"


def _delays(tasks: int, spread: float) -> list[float]:
    """``tasks`` delays spread evenly over 1..``spread`` seconds, in a shuffled order."""
    step = (spread - 1) / max(1, tasks - 1)
    ordered = [1 + i * step for i in range(tasks)]
    return ordered[0::2] + ordered[1::2][::-1]  # not submitted in due order


async def levels(node: LocalRabbitNode, tasks: int, spread: float) -> list[float]:
    """Errors (s) of delayed messages through the delay levels alone."""
    broker = RabbitBroker(node.url, name="bench-delays")
    spec = QueueSpec("truba.bench.delays", delays=True)
    try:
        await broker.declare(spec)
        sender = await broker.sender(spec, delayed=True, max_unconfirmed=1000)
        listener = await broker.listener(spec.name, prefetch=1000)
        confirms = []
        for i, seconds in enumerate(_delays(tasks, spread)):
            due = time.time() + seconds
            confirms.append(await sender.send(delay.with_due(f"{i}:{due!r}".encode(), due)))
        await asyncio.gather(*confirms)
        errors: list[float] = []
        deadline = time.monotonic() + spread + 60
        while len(errors) < tasks and time.monotonic() < deadline:
            got = await listener.get(1.0)
            if got is None:
                continue
            errors.append(time.time() - float(got.message.decode().split(":", 1)[1]))
            await got.ack()
        await listener.close()
        await sender.close()
        return errors
    finally:
        await broker.close()


async def job(cluster: LocalCluster, tasks: int, spread: float, journal: Path) -> list[float]:
    """Errors (s) of a job's delayed tasks: when each started minus its due time."""
    async with Client(cluster.address, journal=journal) as client:
        bench_job = await client.create_job(HANDLER, name="bench-delays")
        dues: dict[str, float] = {}
        for seconds in _delays(tasks, spread):
            due = time.time() + seconds
            dues[await bench_job.submit(0.0, delay=seconds)] = due
        await bench_job.close()
        return [float(o.value) - dues[o.task_id] async for o in bench_job.results()]  # type: ignore[arg-type]


def summary(errors: list[float], tasks: int) -> dict[str, float]:
    return {
        "count": len(errors),
        "missing": tasks - len(errors),
        "p50_ms": percentile(errors, 50) * 1000,
        "p99_ms": percentile(errors, 99) * 1000,
        "worst_late_ms": max(errors) * 1000,
        "worst_early_ms": min(errors) * 1000,
        "over_1s": sum(1 for e in errors if abs(e) > 1.0),
    }


async def run(
    args: argparse.Namespace, node: LocalRabbitNode, cluster: LocalCluster, tmp: Path
) -> dict[str, object]:
    results: dict[str, dict[str, float]] = {}
    results["levels"] = summary(await levels(node, args.tasks, args.spread), args.tasks)
    print(f"levels: {results['levels']}", flush=True)
    results["job"] = summary(await job(cluster, args.tasks, args.spread, tmp / "journal"), args.tasks)
    print(f"job:    {results['job']}", flush=True)
    return {
        "tasks": args.tasks,
        "spread_s": args.spread,
        "slots": args.slots,
        "tick_s": delay.TICK,
        "levels": delay.LEVELS,
        "results": results,
    }


def print_table(result: dict[str, object]) -> None:
    results: dict[str, dict[str, float]] = result["results"]  # type: ignore[assignment]
    print(
        f"\n{result['tasks']} delayed tasks, delays 1..{result['spread_s']} s, daemon slots {result['slots']}"
    )
    print(f"{'variant':<9}{'p50 ms':>9}{'p99 ms':>9}{'late ms':>9}{'early ms':>10}{'>1 s':>6}{'lost':>6}")
    for name, r in results.items():
        print(
            f"{name:<9}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['worst_late_ms']:>9.1f}"
            f"{r['worst_early_ms']:>10.1f}{r['over_1s']:>6.0f}{r['missing']:>6.0f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--spread", type=float, default=30.0)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench/results/delays.json"))
    args = parser.parse_args()
    with one_daemon_cluster("truba-bench-delays-", args.slots) as bench:
        result = asyncio.run(run(args, bench.node, bench.cluster, bench.tmp))
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
