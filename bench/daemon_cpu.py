"""The daemon's own CPU per task, without a broker (issue 18): repeatable where W1 is not.

A job runner of ``--slots`` real slots (``tests.handlers.basic:echo``) is fed task frames of
``--frame`` tasks of 100 B from in-memory pipes (``truba.pipes.testing``: every result confirmed
at once), as a daemon's listener would hand them over under W1; the CPU time of this process
(user + system: the runner, its pipes' layers above the broker leaves, the slots' pipes; the
slots' own CPU not counted) per task, for each of ``--rounds`` rounds of ``--tasks`` tasks after
a warm-up, and the event loop's iterations per task (one iteration: one wake-up of the loop, the
callbacks ready then run). What it leaves out is the RabbitMQ leaves (aiormq, pamqp, the sockets): per frame,
not per task, under W1.

W2's single-task path: ``--one``, each task pushed alone and its result awaited before the next.

    python bench/daemon_cpu.py [--tasks 20000] [--rounds 3] [--slots 2] [--frame 50] [--one]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from truba.daemon.job_pipes import JobPipes
from truba.daemon.runner import JobRunner
from truba.daemon.slot_process import SlotProcess
from truba.pipes.base import Confirmation
from truba.pipes.frame import FrameLimits, FrameListener, pack
from truba.pipes.serialize import DeserializeListener
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import GaveUpRecord, ResultMessage, TaskCodec, TaskMessage

HANDLER = "tests.handlers.basic:echo"
CODEC = TaskCodec()
BODY = b"x" * 100


class Results(FakeSender[ResultMessage]):
    """Results, each confirmed at once; ``arrived`` is set at each."""

    def __init__(self) -> None:
        super().__init__(auto_confirm=True)
        self.arrived = asyncio.Event()

    async def send(self, message: ResultMessage) -> Confirmation:
        confirmation = await super().send(message)
        self.arrived.set()
        return confirmation


class Iterations:
    """Counts the running loop's iterations (``_run_once``: a CPython asyncio detail, for a bench)."""

    def __init__(self) -> None:
        self.count = 0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        run_once = loop._run_once  # type: ignore[attr-defined]

        def counted() -> None:
            self.count += 1
            run_once()

        loop._run_once = counted  # type: ignore[attr-defined]


iterations = Iterations()


async def measure(args: argparse.Namespace) -> list[float]:
    iterations.install(asyncio.get_running_loop())
    wire: FakeListener[bytes] = FakeListener()
    results = Results()
    unframe = FrameListener(wire)
    requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
    dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
    limits = FrameLimits()
    pipes = JobPipes(DeserializeListener(unframe, CODEC), results, requeue, dead, limits, unframe)
    runner = JobRunner("bench", HANDLER, "d", pipes, lambda slot: None, target=args.slots)
    slots = [SlotProcess(i) for i in range(args.slots)]
    for slot in slots:
        runner.add_worker(slot)
    sent = 0

    async def run(count: int) -> None:
        nonlocal sent
        start, sent = sent, sent + count
        if args.one:
            for i in range(start, sent):
                results.arrived.clear()
                wire.push(CODEC.encode(TaskMessage(f"t{i}", BODY)))
                while len(results.sent) <= i:
                    await results.arrived.wait()
                    results.arrived.clear()
            return
        for first in range(start, sent, args.frame):
            ids = range(first, min(sent, first + args.frame))
            wire.push(pack([CODEC.encode(TaskMessage(f"t{i}", BODY)) for i in ids]))
        while len(results.sent) < sent:
            await results.arrived.wait()
            results.arrived.clear()

    try:
        await run(min(args.tasks, 2000))  # warm: slots started, the handler described, chunks on
        per_task = []
        for round_ in range(args.rounds):
            began, turns = time.process_time(), iterations.count
            await run(args.tasks)
            per_task.append((time.process_time() - began) / args.tasks * 1e6)
            per_turn = (iterations.count - turns) / args.tasks
            print(
                f"round {round_ + 1}: {per_task[-1]:.1f} µs of daemon CPU per task, "
                f"{per_turn:.2f} loop iterations per task",
                flush=True,
            )
        return per_task
    finally:
        runner.stop_now()
        await runner.close()
        for slot in slots:
            await slot.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--frame", type=int, default=50)
    parser.add_argument("--one", action="store_true", help="one task at a time (W2's path)")
    args = parser.parse_args()
    per_task = asyncio.run(measure(args))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"median {statistics.median(per_task):.1f} µs per task (load average {load})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
