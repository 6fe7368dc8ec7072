"""Preemption latency: from the scheduler's reassignment to a slot running the new job's first task.

A real daemon (``python -m truba.daemon``, info logs) driven by the test harness's scripted
scheduler (tests/integration/test_daemon_harness.py) over two local brokers: the scripted
scheduler sends exactly one Assignment at a known instant, which the real scheduler's planner
would not (its timing would be the planner's, not the daemon's). Each round:

1. {A: all slots}; A's long tasks run on every slot and B's runner is gone (seen in a heartbeat
   sent after the daemon applied {A}: an older one can show A busy on every slot while the
   previous round's B runner still consumes, which made B's task start before t0);
2. one task of job B waits in B's queue;
3. ``t0`` = the Assignment {B: all slots} is handed to the daemon's gRPC stream;
4. B's task returns the wall-clock time its handler started (``tests.handlers.faults:stamp``):
   latency = start − t0. The daemon has no runner for B before the flip: the latency includes
   opening B's pipes (consumer on each broker) and getting the delivery.

Modes:
  immediate  A's tasks would run 60 s; the daemon kills a slot, requeues A's task unspent, and
             B's task starts on it
  graceful   A's tasks take ``--graceful-task`` s and the flip comes at a random point of them;
             B starts when a slot is free: reported both as the total and as the wait beyond
             the end of the first A task that ended after t0 (the daemon's own part)

    python bench/daemon_preemption.py [--rounds 30] [--slots 2] [--graceful-task 1.0] [--spawn]
        [--json bench/results/daemon_preemption.json]

The daemon forks its slots from a template (the default); ``--spawn`` runs it with
``--no-fork-server``: an interrupted slot is then replaced by a fresh interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from report import percentile, write_json

ROOT = Path(__file__).resolve().parent.parent
STAMP = "tests.handlers.faults:stamp"
LONG = 60.0


async def measure(
    urls: list[str], log_dir: Path, mode: str, rounds: int, slots: int, task: float, spawn: bool = False
) -> dict[str, object]:
    from tests.integration.test_daemon_harness import JobQueues, eventually, job_slots, scripted
    from truba.wire import TaskMessage

    immediate = mode == "immediate"
    a = JobQueues(f"bench-preempt-{mode}-a-{os.getpid()}", urls)
    b = JobQueues(f"bench-preempt-{mode}-b-{os.getpid()}", urls)
    await a.declare()
    await b.declare()
    latencies: list[float] = []
    beyond: list[float] = []
    a_length = LONG if immediate else task
    a_sent = 0
    try:
        async with scripted(urls, log_dir) as (scheduler, start_daemon):
            daemon_id = f"bench-preempt-{mode}"
            start_daemon(daemon_id, slots, "--log-level", "info", *(["--no-fork-server"] if spawn else []))
            await eventually(lambda: scheduler.connected(daemon_id), what="daemon connected")
            on_a = job_slots(a, STAMP, slots, immediate=immediate)
            on_b = job_slots(b, STAMP, slots, immediate=immediate)
            for round_ in range(rounds):
                # Keep A's queue topped up (immediate: interrupted tasks come back; graceful: they end).
                missing = slots - (a.counts()[a.tasks] if round_ else 0)
                if missing > 0:
                    await a.submit(*[TaskMessage(f"a{a_sent + i}", a_length) for i in range(missing)])
                    a_sent += missing
                scheduler.assign(daemon_id, on_a)
                # Only A, on all slots, per a heartbeat sent after the daemon applied {A}: a busy
                # count alone may come from a heartbeat older than the flip back to A, and B's
                # task would then run on the previous round's B runner, before t0.
                await eventually(lambda: scheduler.settled(daemon_id, a.job_id, slots), what="only A")
                b_id = f"b{round_}"
                await b.submit(TaskMessage(b_id, 0.0))
                # Immediate: any moment; graceful: a random point of A's running tasks.
                await asyncio.sleep(0.2 if immediate else random.uniform(0.05, task / 2))
                t0 = scheduler.assign(daemon_id, on_b)
                await b.collect([b_id], timeout=30 + a_length if not immediate else 30)
                began = b.outcome(b_id).value["began"]  # type: ignore[index]
                latencies.append(began - t0)
                if not immediate:
                    # The A task whose slot B took: the first to end after t0.
                    await asyncio.sleep(0)
                    ends = await _a_ends_after(a, t0, slots, a_length)
                    beyond.append(began - min(ends))
                print(
                    f"  {mode} round {round_ + 1}: {latencies[-1] * 1e3:7.1f} ms"
                    + (f" (beyond A's end {beyond[-1] * 1e3:6.1f} ms)" if beyond else ""),
                    file=sys.stderr,
                )
    finally:
        await a.delete()
        await b.delete()
    result: dict[str, object] = {
        "rounds": rounds,
        "slots": slots,
        "a_task_seconds": a_length,
        "latency_ms": _summary(latencies),
        "samples_ms": [round(x * 1e3, 2) for x in latencies],
    }
    if beyond:
        result["beyond_a_end_ms"] = _summary(beyond)
        result["beyond_samples_ms"] = [round(x * 1e3, 2) for x in beyond]
    return result


async def _a_ends_after(a: object, t0: float, slots: int, length: float) -> list[float]:
    """Ends (wall clock) of A's tasks that ended after t0, from their results (waits for one)."""
    await a.collect([], 0.0)  # type: ignore[attr-defined]  # opens the result listener
    deadline = time.monotonic() + length + 10
    while time.monotonic() < deadline:
        await a._take_one(0.1)  # type: ignore[attr-defined]
        ends = [r[0].value["ended"] for r in a.received.values() if r[0].value["ended"] >= t0]  # type: ignore[attr-defined]
        if ends:
            return ends
    raise AssertionError("no A task ended after the flip")


def _summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values]
    return {
        "p50": round(statistics.median(ms), 2),
        "p99": round(percentile(ms, 99), 2),
        "min": round(min(ms), 2),
        "max": round(max(ms), 2),
        "mean": round(statistics.fmean(ms), 2),
    }


def print_table(result: dict[str, dict[str, object]]) -> None:
    print(f"\n{'mode':<28}{'p50 ms':>9}{'p99 ms':>9}{'min':>8}{'max':>8}{'n':>5}")
    for mode, row in result.items():
        for key, label in (("latency_ms", mode), ("beyond_a_end_ms", f"{mode} (beyond A's end)")):
            if key in row:
                s: dict[str, float] = row[key]  # type: ignore[assignment]
                print(
                    f"{label:<28}{s['p50']:>9.1f}{s['p99']:>9.1f}{s['min']:>8.1f}{s['max']:>8.1f}{row['rounds']:>5}"
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument(
        "--graceful-task", type=float, default=1.0, help="seconds each A task runs (graceful)"
    )
    parser.add_argument("--modes", default="immediate,graceful")
    parser.add_argument(
        "--spawn", action="store_true", help="daemon with --no-fork-server (slots spawned, not forked)"
    )
    parser.add_argument("--json", type=Path, default=Path("bench/results/daemon_preemption.json"))
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    sys.path[:0] = [str(ROOT)]
    os.chdir(ROOT)
    from truba.local.nodes import start_nodes

    nodes = start_nodes(Path(tempfile.mkdtemp(prefix="truba-bench-")), 2)
    result: dict[str, dict[str, object]] = {}
    try:
        log_dir = Path(tempfile.mkdtemp(prefix="truba-bench-logs-"))
        for mode in args.modes.split(","):
            result[mode] = asyncio.run(
                measure(
                    [n.url for n in nodes],
                    log_dir,
                    mode,
                    args.rounds,
                    args.slots,
                    args.graceful_task,
                    args.spawn,
                )
            )
    finally:
        for node in nodes:
            node.stop()
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
