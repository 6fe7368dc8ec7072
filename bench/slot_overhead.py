"""Per-task cost of running a handler in a slot subprocess versus calling it inline, in the same run.

Handlers busy-wait (``spin``: a perf_counter loop, no sleep, so the handler's own time is exact
and the scheduler's wake-up latency does not blur the 100 µs case) for 100 µs, 1 ms and 10 ms.

Slot start: ms from asking for a slot until it answered its first (empty) task, for a slot
spawned as a fresh interpreter (``spawn``) and one forked from the fork server's template that
preloaded the handler (``fork``, :mod:`truba.daemon.forkserver`; the template itself is started
once, before the timing).

Two levels, each reported as µs per task beyond the handler's own time, and as a ratio:

  slot       ``SlotProcess.run`` in a loop (one warm slot: frame out over a pipe, the slot's
             import cache, the handler, frame back) versus calling ``spin`` directly, N tasks;
             for a spawned slot (``slot``) and a forked one (``fork``)
  daemon     a real daemon (``python -m truba.daemon``, 1 slot, info logs) driven by the test
             harness's scripted scheduler over local brokers: N tasks published first, then the
             slot assigned; tasks/s from the first result to the last (steady state: no start-up),
             versus the inline ideal 1 / handler time. This adds what the daemon does per task:
             get from the prefetch, publish the result with confirm, ack.

Variants are interleaved over rounds and the median kept: these machines are shared and noisy.

    python bench/slot_overhead.py [--tasks 2000] [--daemon-tasks 1000] [--rounds 3] [--no-daemon]
        [--starts 30] [--json bench/results/slot_overhead.json]
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
from typing import TYPE_CHECKING

from report import percentile, write_json
from spin_handler import spin

if TYPE_CHECKING:
    from truba.daemon.launch import Launcher

ROOT = Path(__file__).resolve().parent.parent
HANDLER = "bench.spin_handler:spin"
HANDLER_SECONDS = {"100us": 100e-6, "1ms": 1e-3, "10ms": 10e-3}


def inline(seconds: float, n: int) -> float:
    """Seconds for n direct calls of the handler."""
    began = time.perf_counter()
    for _ in range(n):
        spin(seconds)
    return time.perf_counter() - began


def launcher(how: str) -> Launcher:
    from truba.daemon.forkserver import ForkServer
    from truba.daemon.launch import Spawn

    return ForkServer([HANDLER]) if how == "fork" else Spawn()


async def slot_starts(how: str, n: int) -> list[float]:
    """Seconds from start() to the first reply, n times (the template is up before the first)."""
    from truba.daemon.slot_process import SlotProcess

    launch = launcher(how)
    slot = SlotProcess(0, launch)
    await slot.run(HANDLER, "warm", 0.0)
    await slot.stop()
    times = []
    try:
        for i in range(n):
            began = time.perf_counter()
            await slot.start()
            await slot.run(HANDLER, f"s{i}", 0.0)
            times.append(time.perf_counter() - began)
            await slot.stop()
    finally:
        await slot.stop()
        await launch.close()
    return times


async def through_slot(seconds: float, n: int, how: str = "spawn") -> float:
    """Seconds for n tasks through one warm SlotProcess (spawned or forked)."""
    from truba.daemon.slot_process import SlotProcess

    launch = launcher(how)
    slot = SlotProcess(0, launch)
    await slot.start()
    try:
        for i in range(20):  # warm: interpreter up, handler imported
            await slot.run(HANDLER, f"warm{i}", seconds)
        began = time.perf_counter()
        for i in range(n):
            reply = await slot.run(HANDLER, f"t{i}", seconds)
            assert reply.ok, reply
        return time.perf_counter() - began
    finally:
        await slot.stop()
        await launch.close()


async def through_daemon(urls: list[str], log_dir: Path, seconds: float, n: int, tag: str) -> float:
    """Seconds per task between the first and the last result of n tasks on a 1-slot daemon."""
    from tests.integration.test_daemon_harness import JobQueues, eventually, job_slots, scripted
    from truba.wire import TaskMessage

    job = JobQueues(f"bench-slot-{tag}-{os.getpid()}", urls)
    await job.declare()
    try:
        tasks = [TaskMessage(f"t{i}", seconds) for i in range(n)]
        await job.submit(*tasks)
        async with scripted(urls, log_dir) as (scheduler, start_daemon):
            daemon_id = f"bench-{tag}"
            start_daemon(daemon_id, 1, "--allow", "bench.*", "--log-level", "info")
            await eventually(lambda: scheduler.connected(daemon_id), what="daemon connected")
            scheduler.assign(daemon_id, job_slots(job, HANDLER, 1))
            arrivals: list[float] = []
            ids = [t.task_id for t in tasks]
            # collect() keeps results by id; time their arrival by polling the count.
            collecting = asyncio.create_task(job.collect(ids, timeout=600))
            while not collecting.done():
                count = len(job.received)
                if count > len(arrivals):
                    arrivals.extend([time.perf_counter()] * (count - len(arrivals)))
                await asyncio.sleep(0.001)
            await collecting
            arrivals.extend([time.perf_counter()] * (n - len(arrivals)))
            assert all(job.outcome(i).ok for i in ids)
            return (arrivals[-1] - arrivals[0]) / (n - 1)
    finally:
        await job.delete()


async def run(args: argparse.Namespace, urls: list[str], log_dir: Path) -> dict[str, object]:
    per_task: dict[str, dict[str, list[float]]] = {
        name: {"inline": [], "slot": [], "fork": [], "daemon": []} for name in HANDLER_SECONDS
    }
    starts: dict[str, list[float]] = {"spawn": [], "fork": []}
    for round_ in range(args.rounds):
        for how, samples in starts.items():
            samples += await slot_starts(how, args.starts)
            print(
                f"  round {round_ + 1} start {how:<6} {statistics.median(samples) * 1e3:8.2f} ms",
                file=sys.stderr,
            )
        for name, seconds in HANDLER_SECONDS.items():
            times = per_task[name]
            times["inline"].append(inline(seconds, args.tasks) / args.tasks)
            times["slot"].append(await through_slot(seconds, args.tasks) / args.tasks)
            times["fork"].append(await through_slot(seconds, args.tasks, "fork") / args.tasks)
            line = f"  round {round_ + 1} {name:<6} inline {times['inline'][-1] * 1e6:8.1f} µs"
            line += f"  slot {times['slot'][-1] * 1e6:8.1f} µs  fork {times['fork'][-1] * 1e6:8.1f} µs"
            if urls:
                tag = f"{name}-{round_}"
                times["daemon"].append(await through_daemon(urls, log_dir, seconds, args.daemon_tasks, tag))
                line += f"  daemon {times['daemon'][-1] * 1e6:8.1f} µs"
            print(line, file=sys.stderr)
    table: dict[str, dict[str, float]] = {}
    for name, times in per_task.items():
        medians = {k: statistics.median(v) * 1e6 for k, v in times.items() if v}
        row = {f"{k}_us_per_task": round(v, 1) for k, v in medians.items()}
        row["slot_overhead_us"] = round(medians["slot"] - medians["inline"], 1)
        row["slot_ratio"] = round(medians["slot"] / medians["inline"], 3)
        row["fork_overhead_us"] = round(medians["fork"] - medians["inline"], 1)
        if "daemon" in medians:
            row["daemon_overhead_us"] = round(medians["daemon"] - medians["inline"], 1)
            row["daemon_ratio"] = round(medians["daemon"] / medians["inline"], 3)
            row["daemon_tasks_per_s"] = round(1e6 / medians["daemon"], 1)
            row["inline_tasks_per_s"] = round(1e6 / medians["inline"], 1)
        table[name] = row
    return {
        "handler": "busy-wait (perf_counter loop)",
        "tasks": args.tasks,
        "daemon_tasks": args.daemon_tasks if urls else 0,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "per_task_us": {
            n: {k: [round(x * 1e6, 1) for x in v] for k, v in t.items()} for n, t in per_task.items()
        },
        "results": table,
        "slot_start_ms": {
            how: {
                "p50": round(statistics.median(v) * 1e3, 2),
                "p90": round(percentile(v, 90) * 1e3, 2),
                "n": len(v),
            }
            for how, v in starts.items()
        },
    }


def print_table(result: dict[str, object]) -> None:
    table: dict[str, dict[str, float]] = result["results"]  # type: ignore[assignment]
    daemon = any("daemon_us_per_task" in row for row in table.values())
    start: dict[str, dict[str, float]] = result["slot_start_ms"]  # type: ignore[assignment]
    print(f"\n{'slot start':<12}{'p50 ms':>9}{'p90 ms':>9}{'n':>6}")
    for how, row in start.items():
        print(f"{how:<12}{row['p50']:>9.2f}{row['p90']:>9.2f}{row['n']:>6.0f}")
    head = f"\n{'handler':<8}{'inline µs':>11}{'slot µs':>10}{'overhead':>10}{'ratio':>8}{'fork µs':>10}"
    if daemon:
        head += f"{'daemon µs':>11}{'overhead':>10}{'ratio':>8}{'tasks/s':>9}{'ideal/s':>9}"
    print(head)
    for name, row in table.items():
        line = f"{name:<8}{row['inline_us_per_task']:>11.1f}{row['slot_us_per_task']:>10.1f}"
        line += f"{row['slot_overhead_us']:>10.1f}{row['slot_ratio']:>8.2f}{row['fork_us_per_task']:>10.1f}"
        if daemon:
            line += f"{row['daemon_us_per_task']:>11.1f}{row['daemon_overhead_us']:>10.1f}"
            line += f"{row['daemon_ratio']:>8.2f}{row['daemon_tasks_per_s']:>9.0f}"
            line += f"{row['inline_tasks_per_s']:>9.0f}"
        print(line)
    print("(µs per task, medians over rounds; overhead = minus inline; ratio = over inline)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per slot/inline measurement")
    parser.add_argument("--daemon-tasks", type=int, default=1000, help="tasks per daemon measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-daemon", action="store_true", help="skip the end-to-end daemon variant")
    parser.add_argument("--starts", type=int, default=30, help="slot starts timed per launcher and round")
    parser.add_argument("--json", type=Path, default=Path("bench/results/slot_overhead.json"))
    args = parser.parse_args()
    # Slots and the daemon import the handler as bench.slot_overhead, the harness from tests/.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    sys.path[:0] = [str(ROOT)]
    os.chdir(ROOT)
    nodes = []
    if not args.no_daemon:
        from truba.local import start_nodes

        nodes = start_nodes(Path(tempfile.mkdtemp(prefix="truba-bench-")), 2)
    try:
        log_dir = Path(tempfile.mkdtemp(prefix="truba-bench-logs-"))
        result = asyncio.run(run(args, [n.url for n in nodes], log_dir))
    finally:
        for node in nodes:
            node.stop()
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
