"""The cost of the daemon's per-task log events (issue 17): W1 with the daemon at warning, info, debug.

W1 (``client_sdk.sdk_w1``: N no-op tasks end to end through the SDK, results back, every
guarantee on) against one broker and a scheduler, with one daemon of --slots slots that logs
(JSON lines, to its log file, as ``truba up`` runs it) at:

  warning  no per-task event at all (the baseline)
  info     the default: each task's events buffered, written for troubled tasks and one ok
           task in 64 (see truba.daemon.task_events)
  debug    every task's events written as they happen (received, started, ended, confirmed,
           acked; and the pipes' own per-message debug events)

Only one daemon runs at a time: each measurement starts its daemon, waits until the scheduler
sees it alone, runs W1 and stops it. Variants are interleaved over rounds (their order rotated
each round), the median kept, and
the ratios to warning and debug/info reported (measured in the same run), with the lines the
daemon wrote and the daemon process's own CPU time per task (user + system, its slots not
counted: what logging adds there is its cost, and it is far less noisy than throughput on a
shared machine).

    python bench/daemon_logging.py [--tasks 20000] [--rounds 3] [--slots 2]
                                   [--json bench/results/daemon_logging.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from client_sdk import sdk_w1
from report import Steal, write_json

from truba.client import Client
from truba.local import start_nodes
from truba.local.cluster import LocalCluster, TrubaProcess

LEVELS = ("warning", "info", "debug")


async def daemons_connected(cluster: LocalCluster) -> int:
    async with Client(cluster.address, journal=False) as client:
        return (await client.cluster_info()).daemons


async def wait_for_daemons(cluster: LocalCluster, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while await daemons_connected(cluster) != count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {count} daemons connected after {timeout:.0f} s")
        await asyncio.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (its children not counted)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    cluster: LocalCluster, level: str, name: str, args: argparse.Namespace, journal: Path
) -> tuple[float, int, float]:
    """W1's tasks per second with a fresh daemon logging at ``level``, the lines it wrote, and its
    CPU microseconds per task."""
    daemon: TrubaProcess = cluster.start_daemon(name, args.slots, ["tests.handlers.*"], "--log-level", level)
    try:
        await wait_for_daemons(cluster, 1)
        began = cpu_seconds(daemon.pid)
        rate = await sdk_w1(cluster, args.tasks, journal)
        cpu = (cpu_seconds(daemon.pid) - began) / args.tasks * 1e6
    finally:
        daemon.terminate()
        await wait_for_daemons(cluster, 0)
    lines = len(daemon.log().splitlines())
    return rate, lines, cpu


async def run(args: argparse.Namespace, cluster: LocalCluster, tmp: Path) -> dict[str, object]:
    rates: dict[str, list[float]] = {}
    lines: dict[str, list[int]] = {}
    cpu: dict[str, list[float]] = {}
    steal: dict[str, list[float]] = {}
    clock = Steal()
    for round_ in range(args.rounds):
        # Each in turn (the variants never overlap), the order rotated every round: on a shared
        # machine the position in a round matters as much as the level.
        for level in LEVELS[round_ % len(LEVELS) :] + LEVELS[: round_ % len(LEVELS)]:
            clock.lap()
            rate, wrote, used = await measure(
                cluster, level, f"d-{level}-{round_}", args, tmp / f"{level}-{round_}"
            )
            rates.setdefault(level, []).append(rate)
            lines.setdefault(level, []).append(wrote)
            cpu.setdefault(level, []).append(used)
            steal.setdefault(level, []).append(stolen := clock.lap())
            print(
                f"round {round_ + 1}: {level:<6} {rate:>9.0f} tasks/s  {wrote:>7} log lines"
                f"  {used:>6.0f} us daemon CPU/task  (steal {stolen:.0%})",
                flush=True,
            )
    medians = {level: statistics.median(values) for level, values in rates.items()}
    cpu_medians = {level: statistics.median(values) for level, values in cpu.items()}
    return {
        "tasks": args.tasks,
        "rounds": args.rounds,
        "slots": args.slots,
        "rates": rates,
        "log_lines": lines,
        "daemon_cpu_us_per_task": cpu,
        "cpu_medians": cpu_medians,
        "steal": steal,
        "medians": medians,
        "ratios": {
            "info/warning": medians["info"] / medians["warning"],
            "debug/warning": medians["debug"] / medians["warning"],
            "debug/info": medians["debug"] / medians["info"],
            "cpu info/warning": cpu_medians["info"] / cpu_medians["warning"],
            "cpu debug/warning": cpu_medians["debug"] / cpu_medians["warning"],
        },
    }


def print_table(result: dict[str, object]) -> None:
    medians: dict[str, float] = result["medians"]  # type: ignore[assignment]
    lines: dict[str, list[int]] = result["log_lines"]  # type: ignore[assignment]
    cpu: dict[str, float] = result["cpu_medians"]  # type: ignore[assignment]
    ratios: dict[str, float] = result["ratios"]  # type: ignore[assignment]
    print(
        f"\nW1: {result['tasks']} tasks, median of {result['rounds']} rounds, daemon slots {result['slots']}"
    )
    print(f"{'daemon log level':<18}{'tasks/s':>10}{'log lines':>12}{'CPU us/task':>14}")
    for level, rate in medians.items():
        print(f"{level:<18}{rate:>10.0f}{statistics.median(lines[level]):>12.0f}{cpu[level]:>14.0f}")
    print()
    for name, ratio in ratios.items():
        print(f"{name:<18}{ratio:>10.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench/results/daemon_logging.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="truba-bench-logging-") as folder:
        tmp = Path(folder)
        (node,) = start_nodes(tmp / "rmq", 1)
        cluster = LocalCluster(tmp / "cluster")
        try:
            cluster.start_scheduler([node.url], "127.0.0.1:0")
            result = asyncio.run(run(args, cluster, tmp))
        finally:
            cluster.stop()
            node.stop()
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
