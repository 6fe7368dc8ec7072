"""End to end, against raw aio-pika doing the same work in the same run (issue 18): W1 and W2.

W1 (throughput): N no-op tasks (``tests.handlers.basic:echo``) with a payload of 100 B, 10 KB
or 1 MB, submitted through the SDK (journal on) as fast as it takes them, every outcome taken
(the result carries the payload back), one daemon (``--slots`` slots), over 1 broker and over 2.
raw: an aio-pika client per broker (publish persistent with confirms, a window of 1000; consume
the results) and an aio-pika worker process per broker (``client_sdk.py --raw-worker``: per
task, the result published with confirm, then the task acked), the tasks split over the
brokers; quorum queues on both sides, as truba's default. Also CPU per task by process (from
/proc: user + system): the client (this process), the daemon, its slots, the brokers, and raw's
workers.

W2 (latency): one task at a time, submit then wait for its outcome (see ``latency.py``, which
also splits it into hops): p50/p90/p99 for truba and for raw aio-pika.

Variants are interleaved over rounds and the median kept (W2: all samples pooled); ratios are
truba/raw, measured in the same run. ``--quick`` runs fewer tasks and one round (about a
minute); the default takes a few minutes. ``--w1-only`` runs only W1 with 100 B over 1 broker
(20,000 tasks; 5,000 with ``--quick``), for interleaved A/B runs (``--sizes 1000000,10000``: only
W1 over 1 broker with those payloads); with ``bench/amqp_count`` it
also counts AMQP messages per task (see its ``sitecustomize.py``).

    python bench/e2e.py [--quick] [--w1-only | --sizes 1000000,10000 [--tasks 300]] [--rounds 3]
                        [--slots 2] [--json bench/results/e2e.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
from client_sdk import HANDLER, WINDOW, fresh_queue, raw_publish
from latency import raw_w2, truba_w2
from local import Bench, one_daemon_cluster
from report import CpuMeter, descendants, percentile, write_json

from truba.client import Client
from truba.wire import ResultCodec, TaskCodec, TaskMessage

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Case:
    """One W1 measurement: ``tasks`` tasks of ``size`` bytes over ``brokers`` brokers."""

    size: int
    tasks: int
    brokers: int

    @property
    def name(self) -> str:
        size = (
            f"{self.size // 1_000_000} MB"
            if self.size >= 1_000_000
            else (f"{self.size // 1000} KB" if self.size >= 1000 else f"{self.size} B")
        )
        return f"{size}, {self.brokers} broker{'s' if self.brokers > 1 else ''}"


FULL = [Case(100, 20_000, 1), Case(10_000, 5_000, 1), Case(1_000_000, 100, 1), Case(100, 20_000, 2)]
QUICK = [Case(100, 5_000, 1), Case(10_000, 2_000, 1), Case(1_000_000, 40, 1), Case(100, 5_000, 2)]


def payload(size: int) -> bytes:
    return b"x" * size


async def truba_w1(bench: Bench, case: Case, journal: Path) -> tuple[float, dict[str, float]]:
    """Tasks per second (submit of the first to the outcome of the last) and CPU seconds by process."""
    body = payload(case.size)
    meter = _meter(
        bench, {"daemon": lambda: [bench.daemon.pid], "slots": lambda: descendants(bench.daemon.pid)}
    )
    async with Client(bench.cluster.address, journal=journal) as client:
        job = await client.create_job(HANDLER, name="bench-e2e-w1")
        meter.start()
        began = time.perf_counter()

        async def submit_all() -> None:
            for _ in range(case.tasks):
                await job.submit(body)
            await job.close()

        submitting = asyncio.create_task(submit_all())
        count = 0
        async for outcome in job.results():
            value = outcome.value
            assert outcome.ok and isinstance(value, bytes) and len(value) == case.size, outcome
            count += 1
        await submitting
        seconds = time.perf_counter() - began
        cpu = meter.stop()
    assert count == case.tasks, count
    return case.tasks / seconds, cpu


async def raw_w1(bench: Bench, case: Case) -> tuple[float, dict[str, float]]:
    """The same work over raw aio-pika: a client and a worker process per broker."""
    urls = [node.url for node in bench.nodes[: case.brokers]]
    tasks, results = "bench.e2e.raw-tasks", "bench.e2e.raw-results"
    workers = []
    for url in urls:
        await fresh_queue(url, tasks)
        await fresh_queue(url, results)
        workers.append(
            await asyncio.create_subprocess_exec(
                sys.executable, str(HERE / "client_sdk.py"), "--raw-worker", url, tasks, results
            )
        )
    meter = _meter(bench, {"workers": lambda: [w.pid for w in workers]})
    try:
        connections = [await aio_pika.connect(url) for url in urls]
        body = payload(case.size)
        codec, decode = TaskCodec(), ResultCodec().decode
        got = 0
        done = asyncio.Event()

        async def on_result(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal got
            result = decode(message.body)
            assert isinstance(result.value, bytes) and len(result.value) == case.size
            await message.ack()
            got += 1
            if got >= case.tasks:
                done.set()

        publishers = []
        for connection in connections:
            publishers.append(await connection.channel(publisher_confirms=True))
            consume = await connection.channel()
            await consume.set_qos(prefetch_count=WINDOW)
            queue = await consume.get_queue(results, ensure=False)
            await queue.consume(on_result)
        share = [case.tasks // len(urls) + (1 if i < case.tasks % len(urls) else 0) for i in range(len(urls))]
        meter.start()
        began = time.perf_counter()
        await asyncio.gather(
            *(
                raw_publish(
                    channel, tasks, [codec.encode(TaskMessage(f"t-{b}-{i}", body)) for i in range(count)]
                )
                for b, (channel, count) in enumerate(zip(publishers, share, strict=True))
            )
        )
        await asyncio.wait_for(done.wait(), 600)
        seconds = time.perf_counter() - began
        cpu = meter.stop()
        for connection in connections:
            await connection.close()
    finally:
        for worker in workers:
            worker.terminate()
            await worker.wait()
    return case.tasks / seconds, cpu


def _meter(bench: Bench, groups: dict[str, object]) -> CpuMeter:
    brokers = [node.pid for node in bench.nodes]
    return CpuMeter({**groups, "brokers": lambda: brokers})  # type: ignore[dict-item]


async def run_w1(
    bench: Bench, cases: list[Case], rounds: int, out: dict[str, dict[str, list[object]]]
) -> None:
    for round_ in range(rounds):
        for case in cases:
            for name in ("raw", "truba"):
                if name == "raw":
                    rate, cpu = await raw_w1(bench, case)
                else:
                    rate, cpu = await truba_w1(
                        bench, case, bench.tmp / f"w1-{round_}-{case.size}-{case.brokers}"
                    )
                entry = out.setdefault(case.name, {}).setdefault(name, [])
                entry.append({"rate": rate, "cpu_us": {k: v / case.tasks * 1e6 for k, v in cpu.items()}})
                print(
                    f"round {round_ + 1}: W1 {case.name:<18} {name:<6} {rate:>9.0f} tasks/s  "
                    + "  ".join(f"{k} {v / case.tasks * 1e6:.0f}" for k, v in cpu.items())
                    + " µs/task",
                    flush=True,
                )


async def run_w2(bench: Bench, tasks: int, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"truba": [], "raw": []}
    for round_ in range(rounds):
        truba, _ = await truba_w2(bench.cluster, tasks, bench.tmp / f"w2-{round_}")
        raw = await raw_w2(bench.node.url, tasks)
        samples["truba"] += truba
        samples["raw"] += raw
        print(
            f"round {round_ + 1}: W2 truba p50 {percentile(truba, 50) * 1000:.2f} ms, "
            f"raw p50 {percentile(raw, 50) * 1000:.2f} ms",
            flush=True,
        )
    return samples


def summarize(w1: dict[str, dict[str, list[object]]], w2: dict[str, list[float]]) -> dict[str, object]:
    table: dict[str, object] = {}
    for case, runs in w1.items():
        row: dict[str, object] = {}
        for name, entries in runs.items():
            rates = [e["rate"] for e in entries]  # type: ignore[index]
            cpu: dict[str, list[float]] = {}
            for e in entries:
                for k, v in e["cpu_us"].items():  # type: ignore[index]
                    cpu.setdefault(k, []).append(v)
            row[name] = {
                "rate": statistics.median(rates),
                "cpu_us": {k: statistics.median(v) for k, v in cpu.items()},
            }
        row["ratio"] = row["truba"]["rate"] / row["raw"]["rate"]  # type: ignore[index]
        table[case] = row
    if not any(w2.values()):  # --w1-only
        return {"w1": table}
    latency = {
        name: {f"p{q}_ms": percentile(s, q) * 1000 for q in (50, 90, 99)} | {"n": len(s)}
        for name, s in w2.items()
    }
    latency["ratio"] = {"p50": latency["truba"]["p50_ms"] / latency["raw"]["p50_ms"]}
    return {"w1": table, "w2": latency}


def print_table(result: dict[str, object]) -> None:
    w1: dict[str, dict[str, Any]] = result["w1"]  # type: ignore[assignment]
    w2: dict[str, dict[str, float]] | None = result.get("w2")  # type: ignore[assignment]
    print(f"\nW1, median of {result['rounds']} rounds, load average {result['load']}")
    print(f"{'case':<20}{'truba/s':>9}{'raw/s':>9}{'ratio':>7}   CPU µs per task (truba | raw)")
    for case, row in w1.items():
        truba, raw = row["truba"], row["raw"]
        t_cpu = " ".join(f"{k} {v:.0f}" for k, v in truba["cpu_us"].items())
        r_cpu = " ".join(f"{k} {v:.0f}" for k, v in raw["cpu_us"].items())
        rates = f"{truba['rate']:>9.0f}{raw['rate']:>9.0f}{row['ratio']:>7.2f}"
        print(f"{case:<20}{rates}   {t_cpu} | {r_cpu}")
    if w2 is None:
        return
    print(f"\nW2, one task at a time, {w2['truba']['n']:.0f} round trips each")
    print(f"{'':<8}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
    for name in ("truba", "raw"):
        print(f"{name:<8}{w2[name]['p50_ms']:>9.2f}{w2[name]['p90_ms']:>9.2f}{w2[name]['p99_ms']:>9.2f}")
    print(f"truba/raw p50 {w2['ratio']['p50']:.2f}")


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    cases = QUICK if args.quick else FULL
    if args.w1_only:
        cases = [c for c in cases if c.size == 100 and c.brokers == 1]
    if args.sizes:
        cases = [c for c in cases if c.size in args.sizes and c.brokers == 1]
    if args.tasks:
        cases = [Case(c.size, args.tasks, c.brokers) for c in cases]
    w1: dict[str, dict[str, list[object]]] = {}
    w2: dict[str, list[float]] = {"truba": [], "raw": []}
    with one_daemon_cluster("truba-bench-e2e-", args.slots, brokers=1) as bench:
        await run_w1(bench, [c for c in cases if c.brokers == 1], args.rounds, w1)
        if not (args.w1_only or args.sizes):
            w2 = await run_w2(bench, args.latency_tasks, args.rounds)
    if any(c.brokers == 2 for c in cases):
        with one_daemon_cluster("truba-bench-e2e2-", args.slots, brokers=2) as bench:
            await run_w1(bench, [c for c in cases if c.brokers == 2], args.rounds, w1)
    return summarize(w1, w2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tasks, one round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--latency-tasks", type=int, default=None)
    parser.add_argument(
        "--w1-only",
        action="store_true",
        help="only W1 with 100 B payloads over 1 broker (no W2): for A/B runs",
    )
    parser.add_argument(
        "--sizes",
        type=lambda text: {int(size) for size in text.split(",")},
        default=None,
        help="only W1 over 1 broker with these payload sizes in bytes (e.g. 1000000,10000; no W2): "
        "for A/B runs of large payloads",
    )
    parser.add_argument("--tasks", type=int, default=None, help="tasks per W1 case (else its own count)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/e2e.json"))
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.latency_tasks = args.latency_tasks or (100 if args.quick else 300)
    began = time.monotonic()
    result = asyncio.run(main_async(args))
    result["rounds"], result["slots"], result["quick"] = args.rounds, args.slots, args.quick
    result["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result["seconds"] = round(time.monotonic() - began)
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
