"""The client SDK against raw aio-pika on the same broker, in the same run: submit and W1.

Submit throughput (tasks/s until every task is confirmed by the broker; the job's daemon is
paused with SIGSTOP meanwhile, so only the submitting side runs):

  raw              aio-pika: confirm channel, a window of 1000 unconfirmed publishes
  memory           ``job.submit`` with ``Client(journal=False)``, then ``close()``
  journal          the same with the journal on disk (fsync ``interval``, the default)
  journal-batch    fsync ``batch`` (group commit), 64 coroutines submitting at once

W1 (the task path end to end: N no-op tasks submitted, run, results back, every guarantee on):

  raw-w1           an aio-pika client (publish with confirms, window 1000; consume results) and
                   an aio-pika worker process (prefetch 100; per task: publish the result with
                   confirm, then ack), both on the same broker
  sdk-w1           ``submit`` N tasks and take N outcomes through the SDK (journal on), run by a
                   real daemon (``tests.handlers.basic:echo``, --slots slots) and scheduler

Variants are interleaved over rounds and the median kept; ratios are to raw in the same run.

    python bench/client_sdk.py [--tasks 20000] [--rounds 3] [--slots 2] [--json bench/results/client_sdk.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Unpack

import aio_pika
from local import one_daemon_cluster
from report import write_json

from truba.client import Client
from truba.client.options import JobOptions
from truba.local.cluster import LocalCluster
from truba.local.node import LocalRabbitNode
from truba.pipes.broker import QueueSpec
from truba.pipes.rabbit import RabbitConnection
from truba.wire import ResultCodec, ResultMessage, TaskCodec, TaskMessage

HANDLER = "tests.handlers.basic:echo"
WINDOW = 1000


async def fresh_queue(url: str, name: str) -> None:
    connection = await RabbitConnection.open(url, name="bench-admin")
    await connection.delete(name)
    await connection.declare(QueueSpec(name, "quorum"))
    await connection.close()


async def raw_publish(channel: aio_pika.abc.AbstractChannel, queue: str, bodies: list[bytes]) -> None:
    """Publishes with confirms, at most WINDOW unconfirmed, until every one is confirmed."""
    room = asyncio.Semaphore(WINDOW)
    pending: set[asyncio.Task[object]] = set()

    async def one(body: bytes) -> None:
        try:
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), queue
            )
        finally:
            room.release()

    for body in bodies:
        await room.acquire()
        task = asyncio.ensure_future(one(body))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)


async def raw_submit(url: str, n: int) -> float:
    queue = "bench.sdk.raw-submit"
    await fresh_queue(url, queue)
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    codec = TaskCodec()
    bodies = [codec.encode(TaskMessage(f"t-{i}", None)) for i in range(n)]
    began = time.perf_counter()
    await raw_publish(channel, queue, bodies)
    seconds = time.perf_counter() - began
    await connection.close()
    return n / seconds


async def sdk_submit(
    cluster: LocalCluster, daemon_pid: int, n: int, journal: Path | None, fsync: str
) -> float:
    async with Client(cluster.address, journal=journal if journal else False, journal_fsync=fsync) as client:  # type: ignore[arg-type]
        job = await client.create_job(HANDLER, name="bench-submit")
        os.kill(daemon_pid, signal.SIGSTOP)
        try:
            began = time.perf_counter()
            if fsync == "batch":
                counter = iter(range(n))

                async def submitter() -> None:
                    for _ in counter:
                        await job.submit(None)

                await asyncio.gather(*(submitter() for _ in range(64)))
            else:
                for _ in range(n):
                    await job.submit(None)
            await job.close()  # returns once every task is confirmed
            seconds = time.perf_counter() - began
        finally:
            os.kill(daemon_pid, signal.SIGCONT)
        await job.cancel()
    return n / seconds


async def raw_w1(url: str, n: int) -> float:
    tasks, results = "bench.sdk.raw-tasks", "bench.sdk.raw-results"
    await fresh_queue(url, tasks)
    await fresh_queue(url, results)
    worker = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--raw-worker", url, tasks, results
    )
    connection = await aio_pika.connect(url)
    publish = await connection.channel(publisher_confirms=True)
    consume = await connection.channel()
    await consume.set_qos(prefetch_count=WINDOW)
    codec = TaskCodec()
    bodies = [codec.encode(TaskMessage(f"t-{i}", None)) for i in range(n)]
    got: set[str] = set()
    done = asyncio.Event()
    decode = ResultCodec().decode

    async def on_result(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.add(decode(message.body).task_id)
        await message.ack()
        if len(got) >= n:
            done.set()

    queue = await consume.get_queue(results, ensure=False)
    await queue.consume(on_result)
    began = time.perf_counter()
    await raw_publish(publish, tasks, bodies)
    await done.wait()
    seconds = time.perf_counter() - began
    await connection.close()
    worker.terminate()
    await worker.wait()
    return n / seconds


async def raw_worker(url: str, tasks: str, results: str) -> None:
    """Per task: the result published with confirm, then the task acked."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.set_qos(prefetch_count=100)
    task_codec, result_codec = TaskCodec(), ResultCodec()

    async def on_task(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        taken = time.monotonic_ns()
        task = task_codec.decode(message.body)
        # The worker's own hops on CLOCK_MONOTONIC (taken, publish), for latency.py's split of
        # raw's round trip: ``raw:<taken>:<publish>``.
        stamps = f"raw:{taken}:{time.monotonic_ns()}"
        result = result_codec.encode(ResultMessage(task.task_id, True, task.payload, daemon_id=stamps))
        await channel.default_exchange.publish(
            aio_pika.Message(result, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), results
        )
        await message.ack()

    queue = await channel.get_queue(tasks, ensure=False)
    await queue.consume(on_task)
    await asyncio.Future()


async def sdk_w1(cluster: LocalCluster, n: int, journal: Path, **job_options: Unpack[JobOptions]) -> float:
    """Tasks per second, submit of the first to the outcome of the last."""
    async with Client(cluster.address, journal=journal) as client:
        job = await client.create_job(HANDLER, name="bench-w1", **job_options)
        began = time.perf_counter()

        async def submit_all() -> None:
            for _ in range(n):
                await job.submit(None)
            await job.close()

        submitting = asyncio.create_task(submit_all())
        count = 0
        async for _ in job.results():
            count += 1
        await submitting
        seconds = time.perf_counter() - began
    assert count == n, count
    return n / seconds


async def run(
    args: argparse.Namespace, node: LocalRabbitNode, cluster: LocalCluster, daemon_pid: int, tmp: Path
) -> dict[str, object]:
    rates: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        folder = tmp / f"round-{round_}"
        runs = {
            "raw": raw_submit(node.url, args.tasks),
            "memory": sdk_submit(cluster, daemon_pid, args.tasks, None, "interval"),
            "journal": sdk_submit(cluster, daemon_pid, args.tasks, folder / "journal", "interval"),
            "journal-batch": sdk_submit(cluster, daemon_pid, args.tasks, folder / "batch", "batch"),
            "raw-w1": raw_w1(node.url, args.tasks),
            "sdk-w1": sdk_w1(cluster, args.tasks, folder / "w1"),
        }
        for name, measure in runs.items():  # each awaited in turn: the variants never overlap
            rate = await measure
            rates.setdefault(name, []).append(rate)
            print(f"round {round_ + 1}: {name:<14} {rate:>9.0f} tasks/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratios = {
        "memory/raw": medians["memory"] / medians["raw"],
        "journal/raw": medians["journal"] / medians["raw"],
        "journal/memory": medians["journal"] / medians["memory"],
        "journal-batch/memory": medians["journal-batch"] / medians["memory"],
        "sdk-w1/raw-w1": medians["sdk-w1"] / medians["raw-w1"],
    }
    return {
        "tasks": args.tasks,
        "rounds": args.rounds,
        "slots": args.slots,
        "rates": rates,
        "medians": medians,
        "ratios": ratios,
    }


def print_table(result: dict[str, object]) -> None:
    medians: dict[str, float] = result["medians"]  # type: ignore[assignment]
    ratios: dict[str, float] = result["ratios"]  # type: ignore[assignment]
    print(f"\n{result['tasks']} tasks, median of {result['rounds']} rounds, daemon slots {result['slots']}")
    print(f"{'variant':<16}{'tasks/s':>10}")
    for name, rate in medians.items():
        print(f"{name:<16}{rate:>10.0f}")
    print(f"\n{'ratio':<22}{'':>6}")
    for name, ratio in ratios.items():
        print(f"{name:<22}{ratio:>6.2f}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--raw-worker":
        asyncio.run(raw_worker(*sys.argv[2:5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench/results/client_sdk.json"))
    args = parser.parse_args()
    with one_daemon_cluster("truba-bench-sdk-", args.slots) as bench:
        result = asyncio.run(run(args, bench.node, bench.cluster, bench.daemon.pid, bench.tmp))
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
