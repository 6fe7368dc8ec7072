"""Counts a process's AMQP traffic by queue, for benchmarks (issue 18): how many messages per task.

Put this folder first on ``PYTHONPATH`` and name an output folder in ``TRUBA_BENCH_AMQP_COUNT``;
every Python process started with that environment (the bench, the scheduler, the daemon; not
slots, which fork) counts, per queue: publishes and their bytes, confirms received (and how many
of them ``multiple``), deliveries, acks sent (and how many ``multiple``), and its event loop's
iterations; written to ``FOLDER/PID.json`` twice a second and at exit (a daemon stopped with a
signal may not reach ``atexit``). ``summary.py`` prints them per task. It patches aiormq's
channel and asyncio's loop: a measuring tool, not for production.

    PYTHONPATH=bench/amqp_count TRUBA_BENCH_AMQP_COUNT=/tmp/amqp \\
        .venv/bin/python bench/e2e.py --w1-only --rounds 1
    .venv/bin/python bench/amqp_count/summary.py /tmp/amqp 20000
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

FOLDER = os.environ.get("TRUBA_BENCH_AMQP_COUNT")


def install(folder: Path) -> None:
    import asyncio.base_events

    import aiormq.channel

    counts: collections.Counter[str] = collections.Counter()
    labels: dict[int, str] = {}  # id(channel) -> the queue it consumes or publishes to
    channel_class: Any = aiormq.channel.Channel

    def label(channel: object, fallback: str = "?") -> str:
        return labels.get(id(channel), fallback)

    publish, ack, consume = channel_class.basic_publish, channel_class.basic_ack, channel_class.basic_consume
    deliver, confirm = channel_class._on_deliver_frame, channel_class._on_confirm_frame

    async def basic_publish(self: object, body: bytes, *args: Any, **kwargs: Any) -> Any:
        queue = str(kwargs.get("routing_key", "?"))
        labels.setdefault(id(self), queue)
        counts[f"{queue} publish"] += 1
        counts[f"{queue} publish_bytes"] += len(body)
        return await publish(self, body, *args, **kwargs)

    async def basic_consume(self: object, queue: str, *args: Any, **kwargs: Any) -> Any:
        labels[id(self)] = queue
        return await consume(self, queue, *args, **kwargs)

    async def basic_ack(self: object, *args: Any, **kwargs: Any) -> Any:
        counts[f"{label(self)} ack"] += 1
        counts[f"{label(self)} ack_multiple"] += bool(kwargs.get("multiple") or (len(args) > 1 and args[1]))
        return await ack(self, *args, **kwargs)

    async def on_deliver(self: object, frame: Any) -> Any:
        counts[f"{frame.routing_key} deliver"] += 1
        return await deliver(self, frame)

    async def on_confirm(self: object, frame: Any) -> Any:
        counts[f"{label(self)} confirm"] += 1
        counts[f"{label(self)} confirm_multiple"] += bool(getattr(frame, "multiple", False))
        return await confirm(self, frame)

    channel_class.basic_publish, channel_class.basic_ack = basic_publish, basic_ack
    channel_class.basic_consume = basic_consume
    channel_class._on_deliver_frame, channel_class._on_confirm_frame = on_deliver, on_confirm

    loop_class: Any = asyncio.base_events.BaseEventLoop
    run_once = loop_class._run_once

    def counted_run_once(self: object) -> None:
        counts["loop iterations"] += 1
        run_once(self)

    loop_class._run_once = counted_run_once

    path = folder / f"{os.getpid()}.json"
    argv = " ".join(sys.argv[:2])

    def dump() -> None:
        path.write_text(json.dumps({"argv": argv, "counts": dict(counts)}))

    def every_half_second() -> None:
        while True:
            time.sleep(0.5)
            dump()

    folder.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=every_half_second, daemon=True).start()
    atexit.register(dump)


if FOLDER:
    install(Path(FOLDER))
