"""Throughput of the task path through truba's pipe stacks versus raw aio-pika, in the same run.

The task path: publish with confirms → consume → ack, N messages of a small payload, one
publisher and one consumer in the same process (as a client and a daemon each would be). Every
variant runs against the same local brokers started here, interleaved over rounds, and the
report gives ratios to the raw aio-pika baseline measured in the same run: these machines are
shared and noisy, absolute numbers travel badly.

    python bench/pipes_throughput.py [--messages 20000] [--rounds 3] [--json bench/results/pipes.json]

Variants:
  raw-1        aio-pika: confirm channel, window of 1000 unconfirmed, consumer prefetch 1000
  stack-1      send_stack → listen_stack on 1 broker (no spool)
  spool-1      the same with the client's disk buffer (fsync interval, the client default)
  raw-2 / stack-2      the same over 2 brokers (raw: round-robin publish, a consumer per broker)
  healthy-b    the send stack alone (publish until confirmed) over broker B
  throttled    the same over [A behind a proxy limited to --throttle bytes/s, B]: how much of
               B's rate the balanced sender keeps when one of its brokers is slow
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aio_pika
from report import write_json

from truba.local import LocalRabbitNode, start_nodes
from truba.pipes.broker import QueueSpec
from truba.pipes.prefetch import Window
from truba.pipes.rabbit import RabbitBroker, RabbitConnection
from truba.pipes.stacks import SendOptions, listen_stack, send_stack

PAYLOAD = b"x" * 64


class BytesCodec:
    def encode(self, message: bytes) -> bytes:
        return message

    def decode(self, data: bytes) -> bytes:
        return data


async def declare(urls: Sequence[str], queue: str) -> None:
    for url in urls:
        connection = await RabbitConnection.open(url, name="bench-admin")
        await connection.delete(queue)
        await connection.declare(QueueSpec(queue, "quorum"))
        await connection.close()


async def raw(urls: Sequence[str], queue: str, n: int) -> float:
    """aio-pika alone: the baseline."""
    connections = [await aio_pika.connect(url) for url in urls]
    pub_channels = [await c.channel(publisher_confirms=True) for c in connections]
    sub_channels = [await c.channel() for c in connections]
    done = asyncio.Event()
    received = 0

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal received
        await message.ack()
        received += 1
        if received >= n:
            done.set()

    for channel in sub_channels:
        await channel.set_qos(prefetch_count=1000)
        q = await channel.declare_queue(queue, passive=True)
        await q.consume(on_message)
    window = asyncio.Semaphore(1000)
    pending: set[asyncio.Task[object]] = set()
    began = time.perf_counter()

    async def publish(i: int) -> None:
        try:
            channel = pub_channels[i % len(pub_channels)]
            await channel.default_exchange.publish(
                aio_pika.Message(PAYLOAD, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                queue,
                mandatory=True,
            )
        finally:
            window.release()

    for i in range(n):
        await window.acquire()
        task: asyncio.Task[object] = asyncio.create_task(publish(i))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    await done.wait()
    seconds = time.perf_counter() - began
    for connection in connections:
        await connection.close()
    return seconds


async def connected_links(urls: Sequence[str]) -> list[RabbitBroker]:
    """Links with their AMQP connection open, as raw's are before its clock starts.

    Only the connections: the leaves' channels open on first use, inside the timed region (a
    round trip each), and nothing is sent ahead, so no balancer estimate is trained off the clock.
    """
    links = [RabbitBroker(url, name=f"bench-{i}", heartbeat=10) for i, url in enumerate(urls)]
    for link in links:
        await link.connection()
    return links


async def stack(urls: Sequence[str], queue: str, n: int, spool_dir: Path | None = None) -> float:
    """truba's send and listen stacks (optionally with the disk buffer)."""
    links = await connected_links(urls)
    spool_layer = None
    if spool_dir is not None:
        from truba.pipes.spool import spool

        spool_layer = spool(spool_dir, fsync="interval")
    sender = send_stack(
        BytesCodec(), links, queue, spool=spool_layer, options=SendOptions(max_unconfirmed=1000)
    ).sender
    listener = listen_stack(BytesCodec(), links, queue, Window(1000)).listener
    received = 0

    async def consume() -> None:
        nonlocal received
        while received < n:
            delivery = await listener.get(1.0)
            if delivery is None:
                continue
            await delivery.ack()
            received += 1

    began = time.perf_counter()
    consumer = asyncio.create_task(consume())
    confirmations = [await sender.send(PAYLOAD) for _ in range(n)]
    await asyncio.gather(*confirmations)
    await consumer
    seconds = time.perf_counter() - began
    await sender.close()
    await listener.close()
    for link in links:
        await link.close()
    return seconds


async def send_only(urls: Sequence[str], queue: str, n: int) -> float:
    """The balanced sender alone: publish with confirms until every confirm is in."""
    links = await connected_links(urls)
    sender = send_stack(BytesCodec(), links, queue, options=SendOptions(max_unconfirmed=1000)).sender
    began = time.perf_counter()
    confirmations = [await sender.send(PAYLOAD) for _ in range(n)]
    await asyncio.gather(*confirmations)
    seconds = time.perf_counter() - began
    await sender.close()
    for link in links:
        await link.close()
    return seconds


async def run(args: argparse.Namespace, nodes: list[LocalRabbitNode], throttled_a: str) -> dict[str, object]:
    a, b = nodes[0].url, nodes[1].url
    n = args.messages
    spool_root = Path(tempfile.mkdtemp(prefix="truba-bench-spool-"))
    variants: dict[str, Callable[[str], Awaitable[float]]] = {
        "raw-1": lambda q: raw([a], q, n),
        "stack-1": lambda q: stack([a], q, n),
        "spool-1": lambda q: stack([a], q, n, spool_root / q),
        "raw-2": lambda q: raw([a, b], q, n),
        "stack-2": lambda q: stack([a, b], q, n),
        "healthy-b": lambda q: send_only([b], q, n),
        "throttled": lambda q: send_only([throttled_a, b], q, n),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, variant in variants.items():
            queue = f"truba.bench.{name}.{round_}"
            await declare([a, b], queue)
            seconds = await variant(queue)
            times[name].append(seconds)
            print(f"  round {round_ + 1} {name:<10} {n / seconds:>9.0f} msg/s", file=sys.stderr)
            await declare([a, b], queue)  # purge what a variant left (it consumed everything)
    rate = {name: n / statistics.median(t) for name, t in times.items()}
    ratios = {
        "stack-1 / raw-1": rate["stack-1"] / rate["raw-1"],
        "spool-1 / raw-1": rate["spool-1"] / rate["raw-1"],
        "stack-2 / raw-2": rate["stack-2"] / rate["raw-2"],
        "stack-2 / stack-1": rate["stack-2"] / rate["stack-1"],
        "throttled / healthy-b": rate["throttled"] / rate["healthy-b"],
    }
    goals = {"stack-1 / raw-1": 0.8, "spool-1 / raw-1": 0.7, "throttled / healthy-b": 0.8}
    return {
        "messages": n,
        "rounds": args.rounds,
        "throttle_bytes_per_s": args.throttle,
        "rate_msgs_per_s": {k: round(v) for k, v in rate.items()},
        "seconds": times,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "goals": goals,
    }


def print_table(result: dict[str, object]) -> None:
    rates: dict[str, int] = result["rate_msgs_per_s"]  # type: ignore[assignment]
    ratios: dict[str, float] = result["ratios"]  # type: ignore[assignment]
    goals: dict[str, float] = result["goals"]  # type: ignore[assignment]
    print(f"\n{'variant':<12}{'msg/s (median)':>16}")
    for name, value in rates.items():
        print(f"{name:<12}{value:>16,}")
    print(f"\n{'ratio':<24}{'value':>8}{'goal':>8}")
    for name, ratio in ratios.items():
        goal = goals.get(name)
        mark = "" if goal is None else ("  ok" if ratio >= goal else "  BELOW GOAL")
        print(f"{name:<24}{ratio:>8.2f}{'' if goal is None else f'{goal:>8.2f}'}{mark}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--throttle", type=int, default=30_000, help="bytes/s through the throttled proxy")
    parser.add_argument("--json", type=Path, default=Path("bench/results/pipes.json"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="truba-bench-"))
    nodes = start_nodes(base, 2)
    # The throttling proxy runs in a process of its own: in a thread here it would take the GIL
    # from the very code being measured.
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("proxy_process.py")),
            nodes[0].host,
            str(nodes[0].port),
            str(args.throttle),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        proxy_port = int(proxy.stdout.readline().split()[1])
        result = asyncio.run(run(args, nodes, f"amqp://guest:guest@127.0.0.1:{proxy_port}/"))
    finally:
        proxy.kill()
        proxy.wait()
        for node in nodes:
            node.stop()
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
