"""The single-task round trip, hop by hop (issue 18), against raw aio-pika in the same run.

truba (W2): ``submit`` one no-op task through the SDK (journal on), wait for its outcome, again;
a real scheduler and daemon (``--slots`` slots), every guarantee on. The processes run in
tracing mode (:mod:`truba.trace`: ``TRUBA_TRACE``), each recording a CLOCK_MONOTONIC timestamp
at every hop of every task, so the round trip splits into hops on one clock:

  client        submit → the task handed to the broker connection (journal, task stack)
  broker        → the daemon's listening leaf has it (publish, quorum queue, delivery)
  intake        → a worker took it (the listen stack, the intake)
  admit         → written to a slot (attempts, spans, the hand-over)
  to slot       → the slot process read it (pipe, wake-up)
  handler       → the handler returned (in the slot)
  from slot     → the daemon read the reply (pipe, wake-up)
  result        → the result handed to the broker connection (end, result stack)
  broker back   → the client's listening leaf has it
  outcome       → ``results()`` yields it (the result stream)

and off the round trip: the task's confirm, the result's confirm, the task's ack after it.

raw: an aio-pika client publishes a task (persistent, confirm channel, not awaited before the
reply), an aio-pika worker process (``client_sdk.py --raw-worker``: the reply published with
confirm, then the task acked) answers, the client takes the reply (and acks it): the same
round trip with the same guarantees but truba's journal, slots and result log, on quorum
queues like truba's.

Rounds interleave the two; all samples pooled. Prints p50/p90/p99 per hop and for both round trips.

    python bench/latency.py [--tasks 300] [--rounds 3] [--slots 2] [--json bench/results/latency.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aio_pika
from client_sdk import HANDLER, fresh_queue
from local import one_daemon_cluster
from report import percentile, write_json

from truba import trace
from truba.client import Client
from truba.local.cluster import LocalCluster
from truba.wire import ResultCodec, TaskCodec, TaskMessage

WARM_UP = 10
HOPS: list[tuple[str, str, str]] = [
    ("client", "client.submit", "tasks.publish"),
    ("broker", "tasks.publish", "tasks.deliver"),
    ("intake", "tasks.deliver", "daemon.taken"),
    ("admit", "daemon.taken", "slot.write"),
    ("to slot", "slot.write", "slot.start"),
    ("handler", "slot.start", "slot.done"),
    ("from slot", "slot.done", "slot.reply"),
    ("result", "slot.reply", "results.publish"),
    ("broker back", "results.publish", "results.deliver"),
    ("outcome", "results.deliver", "client.outcome"),
]
"""The round trip's hops, in order: (name, from, to)."""
OFF_PATH: list[tuple[str, str, str]] = [
    ("task confirm", "tasks.publish", "tasks.confirm"),
    ("result confirm", "results.publish", "results.confirm"),
    ("task ack", "results.confirm", "tasks.ack"),
]


async def truba_w2(cluster: LocalCluster, n: int, journal: Path) -> tuple[list[float], list[str]]:
    """Seconds from submit to outcome, one task at a time (after a few to warm up), and the
    task ids measured."""
    async with Client(cluster.address, journal=journal) as client:
        job = await client.create_job(HANDLER, name="bench-latency")
        outcomes = job.results()
        samples: list[float] = []
        measured: list[str] = []
        for i in range(n + WARM_UP):
            began = time.perf_counter()
            task_id = await job.submit(i)
            outcome = await anext(outcomes)
            if i >= WARM_UP:
                samples.append(time.perf_counter() - began)
                measured.append(task_id)
            assert outcome.ok and outcome.value == i, outcome
        await job.close()
        async for _ in outcomes:  # none left: ends the job
            raise AssertionError("an outcome too many")
    return samples, measured


RAW_HOPS = ("broker", "worker", "broker back", "outcome")
"""raw's round trip split like truba's: publish → the worker has it (broker), → it publishes the
reply (decode, encode), → the client has it (broker back), → the reply is taken (outcome)."""


async def raw_w2(url: str, n: int, hops: dict[str, list[float]] | None = None) -> list[float]:
    """The same round trip over raw aio-pika (see the module docstring); with ``hops``, each
    round trip's split (:data:`RAW_HOPS`, seconds) is appended to it."""
    tasks, results = "bench.latency.raw-tasks", "bench.latency.raw-results"
    await fresh_queue(url, tasks)
    await fresh_queue(url, results)
    here = Path(__file__).parent
    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(here / "client_sdk.py"), "--raw-worker", url, tasks, results
    )
    try:
        connection = await aio_pika.connect(url)
        publish = await connection.channel(publisher_confirms=True)
        consume = await connection.channel()
        await consume.set_qos(prefetch_count=100)
        replies: asyncio.Queue[tuple[str, str, int]] = asyncio.Queue()
        decode = ResultCodec().decode

        async def on_result(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            arrived = time.monotonic_ns()
            await message.ack()
            result = decode(message.body)
            replies.put_nowait((result.task_id, result.daemon_id, arrived))

        queue = await consume.get_queue(results, ensure=False)
        await queue.consume(on_result, no_ack=False)
        codec = TaskCodec()
        samples: list[float] = []
        for i in range(n + WARM_UP):
            task_id = f"raw-{i}"
            body = codec.encode(TaskMessage(task_id, i))
            began = time.perf_counter()
            published = time.monotonic_ns()
            confirm = asyncio.ensure_future(
                publish.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), tasks
                )
            )
            got, stamps, arrived = await asyncio.wait_for(replies.get(), 30)
            if i >= WARM_UP:
                samples.append(time.perf_counter() - began)
                taken_at, sent_at = (int(x) for x in stamps.split(":")[1:3])
                if hops is not None:
                    now = time.monotonic_ns()
                    split = (taken_at - published, sent_at - taken_at, arrived - sent_at, now - arrived)
                    for name, ns in zip(RAW_HOPS, split, strict=True):
                        hops.setdefault(name, []).append(ns / 1e9)
            await confirm
            assert got == task_id, (got, task_id)
        await connection.close()
    finally:
        worker.terminate()
        await worker.wait()
    return samples


def read_traces(folder: Path) -> dict[str, dict[str, int]]:
    """Each task's hops (the first time it passed each), nanoseconds on CLOCK_MONOTONIC."""
    hops: dict[str, dict[str, int]] = defaultdict(dict)
    for path in folder.glob("*.trace"):
        for line in path.read_text().splitlines():
            hop, task_id, ns = line.split()
            hops[task_id].setdefault(hop, int(ns))
    return hops


def breakdown(hops: dict[str, dict[str, int]], task_ids: list[str]) -> dict[str, dict[str, float]]:
    """p50/p90/p99 (ms) of each hop over ``task_ids`` (those that passed both its ends)."""
    table: dict[str, dict[str, float]] = {}
    for name, first, then in HOPS + OFF_PATH:
        values = [
            (hops[t][then] - hops[t][first]) / 1e6
            for t in task_ids
            if first in hops.get(t, {}) and then in hops.get(t, {})
        ]
        if values:
            table[name] = {
                "p50_ms": percentile(values, 50),
                "p90_ms": percentile(values, 90),
                "p99_ms": percentile(values, 99),
                "n": len(values),
            }
    return table


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(samples, 50) * 1000,
        "p90_ms": percentile(samples, 90) * 1000,
        "p99_ms": percentile(samples, 99) * 1000,
        "n": len(samples),
    }


async def measure(args: argparse.Namespace, url: str, cluster: LocalCluster, tmp: Path) -> dict[str, object]:
    truba_samples: list[float] = []
    raw_samples: list[float] = []
    measured: list[str] = []
    raw_hops: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        samples, ids = await truba_w2(cluster, args.tasks, tmp / f"journal-{round_}")
        truba_samples += samples
        measured += ids
        raw = await raw_w2(url, args.tasks, raw_hops)
        raw_samples += raw
        print(
            f"round {round_ + 1}: truba p50 {percentile(samples, 50) * 1000:.2f} ms, "
            f"raw p50 {percentile(raw, 50) * 1000:.2f} ms",
            flush=True,
        )
    raw_split = {name: summary(values) for name, values in raw_hops.items()}
    return {
        "truba": summary(truba_samples),
        "raw": summary(raw_samples),
        "raw_hops": raw_split,
        "measured": measured,
    }


def print_table(result: dict[str, object]) -> None:
    hops: dict[str, dict[str, float]] = result["hops"]  # type: ignore[assignment]
    truba: dict[str, float] = result["truba"]  # type: ignore[assignment]
    raw: dict[str, float] = result["raw"]  # type: ignore[assignment]
    print(f"\none task at a time: {truba['n']} round trips each, load average {result['load']}")
    print(f"{'hop':<16}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
    for name, _, _ in HOPS:
        if name in hops:
            h = hops[name]
            print(f"{name:<16}{h['p50_ms']:>9.3f}{h['p90_ms']:>9.3f}{h['p99_ms']:>9.3f}")
    print("off the round trip:")
    for name, _, _ in OFF_PATH:
        if name in hops:
            h = hops[name]
            print(f"  {name:<14}{h['p50_ms']:>9.3f}{h['p90_ms']:>9.3f}{h['p99_ms']:>9.3f}")
    raw_hops: dict[str, dict[str, float]] = result.get("raw_hops", {})  # type: ignore[assignment]
    if raw_hops:
        print("raw aio-pika's round trip, by hop:")
        for name in RAW_HOPS:
            h = raw_hops[name]
            print(f"  {name:<14}{h['p50_ms']:>9.3f}{h['p90_ms']:>9.3f}{h['p99_ms']:>9.3f}")
    print(f"\n{'round trip':<16}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
    for name, numbers in (("truba", truba), ("raw aio-pika", raw)):
        print(f"{name:<16}{numbers['p50_ms']:>9.2f}{numbers['p90_ms']:>9.2f}{numbers['p99_ms']:>9.2f}")
    print(f"{'truba/raw p50':<16}{truba['p50_ms'] / raw['p50_ms']:>9.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench/results/latency.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="truba-bench-trace-") as folder:
        traces = Path(folder)
        trace.start(traces)  # this process, and the daemon and slots started from now on
        with one_daemon_cluster("truba-bench-latency-", args.slots) as bench:
            result = asyncio.run(measure(args, bench.node.url, bench.cluster, bench.tmp))
        trace.flush()  # the daemon and its slots wrote theirs as they stopped
        measured: list[str] = result.pop("measured")  # type: ignore[assignment]
        result["hops"] = breakdown(read_traces(traces), measured)
    result["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result["tasks"], result["rounds"], result["slots"] = args.tasks, args.rounds, args.slots
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
