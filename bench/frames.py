"""Frame batching (issue 7): W1 with frames on and off against raw aio-pika, and W2 latency.

W1 (20,000 no-op tasks end to end, results back, every guarantee on):

  raw-w1           an aio-pika client (publish with confirms, window 1000; consume results) and
                   an aio-pika worker process (prefetch 100; per task: publish the result with
                   confirm, then ack), on the same broker (see ``client_sdk.py``)
  frames-on        ``submit`` N tasks and take N outcomes through the SDK (journal on), run by a
                   real scheduler and daemon (--slots slots); tasks and results in frames
  frames-off       the same with ``create_job(..., frames=False)``: one AMQP message per task
                   and per result

W2 (one task at a time: submit, then wait for its outcome; --latency-tasks round trips):

  w2-on, w2-off    the round trip's p50 and p99, frames on and off

Variants are interleaved over rounds and the median kept; ratios are to raw (W1) and to
frames off (W2), measured in the same run. Each W1 measurement also prints (and the JSON keeps)
the share of CPU time the hypervisor stole meanwhile, which says how noisy it was.

    python bench/frames.py [--tasks 20000] [--rounds 3] [--slots 2] [--latency-tasks 200]
                           [--json bench/results/frames.json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from client_sdk import HANDLER, raw_w1, sdk_w1
from local import one_daemon_cluster
from report import Steal, percentile, write_json

from truba.client import Client
from truba.local.cluster import LocalCluster
from truba.local.node import LocalRabbitNode


async def sdk_w2(cluster: LocalCluster, n: int, journal: Path, *, frames: bool) -> list[float]:
    """Seconds from submit to outcome, one task at a time (after a few to warm up)."""
    async with Client(cluster.address, journal=journal) as client:
        job = await client.create_job(HANDLER, name="bench-frames-w2", frames=frames)
        outcomes = job.results()
        samples: list[float] = []
        for i in range(n + 10):
            began = time.perf_counter()
            await job.submit(i)
            outcome = await anext(outcomes)
            if i >= 10:
                samples.append(time.perf_counter() - began)
            assert outcome.ok and outcome.value == i, outcome
        await job.close()
        async for _ in outcomes:  # none left: ends the job
            raise AssertionError("an outcome too many")
    return samples


async def run(
    args: argparse.Namespace, node: LocalRabbitNode, cluster: LocalCluster, tmp: Path
) -> dict[str, object]:
    rates: dict[str, list[float]] = {}
    latency: dict[str, list[float]] = {"w2-on": [], "w2-off": []}
    steal: dict[str, list[float]] = {}
    clock = Steal()
    for round_ in range(args.rounds):
        folder = tmp / f"round-{round_}"
        runs = {
            "raw-w1": raw_w1(node.url, args.tasks),
            "frames-on": sdk_w1(cluster, args.tasks, folder / "on", frames=True),
            "frames-off": sdk_w1(cluster, args.tasks, folder / "off", frames=False),
        }
        for name, measure in runs.items():  # each awaited in turn: the variants never overlap
            clock.lap()
            rate = await measure
            rates.setdefault(name, []).append(rate)
            steal.setdefault(name, []).append(stolen := clock.lap())
            print(f"round {round_ + 1}: {name:<12} {rate:>9.0f} tasks/s  (steal {stolen:.0%})", flush=True)
        for name, frames in (("w2-on", True), ("w2-off", False)):
            samples = await sdk_w2(cluster, args.latency_tasks, folder / name, frames=frames)
            latency[name] += samples
            p50 = percentile(samples, 50) * 1000
            print(f"round {round_ + 1}: {name:<12} p50 {p50:.2f} ms", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    w2 = {
        name: {"p50_ms": percentile(samples, 50) * 1000, "p99_ms": percentile(samples, 99) * 1000}
        for name, samples in latency.items()
    }
    ratios = {
        "frames-on/raw-w1": medians["frames-on"] / medians["raw-w1"],
        "frames-off/raw-w1": medians["frames-off"] / medians["raw-w1"],
        "frames-on/frames-off": medians["frames-on"] / medians["frames-off"],
        "w2 p50 on/off": w2["w2-on"]["p50_ms"] / w2["w2-off"]["p50_ms"],
    }
    return {
        "tasks": args.tasks,
        "rounds": args.rounds,
        "slots": args.slots,
        "latency_tasks": args.latency_tasks,
        "rates": rates,
        "steal": steal,
        "medians": medians,
        "w2": w2,
        "ratios": ratios,
    }


def print_table(result: dict[str, object]) -> None:
    medians: dict[str, float] = result["medians"]  # type: ignore[assignment]
    w2: dict[str, dict[str, float]] = result["w2"]  # type: ignore[assignment]
    ratios: dict[str, float] = result["ratios"]  # type: ignore[assignment]
    print(
        f"\nW1: {result['tasks']} tasks, median of {result['rounds']} rounds, daemon slots {result['slots']}"
    )
    print(f"{'variant':<14}{'tasks/s':>10}")
    for name, rate in medians.items():
        print(f"{name:<14}{rate:>10.0f}")
    print(f"\nW2: {result['latency_tasks']} round trips per round, all rounds pooled")
    print(f"{'variant':<14}{'p50 ms':>10}{'p99 ms':>10}")
    for name, numbers in w2.items():
        print(f"{name:<14}{numbers['p50_ms']:>10.2f}{numbers['p99_ms']:>10.2f}")
    print(f"\n{'ratio':<24}{'':>6}")
    for name, ratio in ratios.items():
        print(f"{name:<24}{ratio:>6.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--latency-tasks", type=int, default=200)
    parser.add_argument("--json", type=Path, default=Path("bench/results/frames.json"))
    args = parser.parse_args()
    with one_daemon_cluster("truba-bench-frames-", args.slots) as bench:
        result = asyncio.run(run(args, bench.node, bench.cluster, bench.tmp))
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
