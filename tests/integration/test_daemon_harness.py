"""Support for the daemon's integration tests (no tests here): real daemons and brokers, a scripted scheduler.

- :class:`ScriptedScheduler`: a DaemonService in the test's event loop that welcomes daemons and
  sends them exactly the assignments (with settings) and drains the test asks for, and keeps
  their latest heartbeats;
- :class:`DaemonProcess`: ``python -m truba.daemon`` as a subprocess, to kill -9, SIGSTOP, SIGTERM;
- :class:`JobQueues`: one job's queues declared on the real brokers, a task sender (in frames of
  ``frame`` tasks at most, FRAME by default; None: one per message) and a result listener over
  truba's own pipe stacks (the client's side, with every raw result kept, so duplicates can be
  counted before deduplication).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import msgpack
import pika

from tests import waiting
from truba.pipes.base import Listener
from truba.pipes.broker import QueueSpec
from truba.pipes.frame import FrameLimits
from truba.pipes.prefetch import Window
from truba.pipes.rabbit import RabbitBroker, RabbitConnection
from truba.pipes.stacks import listen_stack, send_stack
from truba.proto.v1 import common_pb2, daemons_pb2, daemons_pb2_grpc
from truba.wire import ResultCodec, ResultMessage, TaskCodec, TaskMessage

ALLOW = "tests.handlers.*"
FRAME = 4
"""Tasks per frame the test client packs at most: small, as a client's first frames are (it sizes
them by the tasks' duration once outcomes come; see truba.client.framing)."""


async def eventually(condition: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    await waiting.eventually(condition, timeout, what or "condition", every=0.02)


@dataclass
class _Session:
    outbox: asyncio.Queue[daemons_pb2.SchedulerMessage] = field(default_factory=asyncio.Queue)


class ScriptedScheduler(daemons_pb2_grpc.DaemonServiceServicer):
    """A scheduler that does only what the test says (see the module docstring)."""

    def __init__(self, brokers: Sequence[str], heartbeat_interval: float = 0.3) -> None:
        self.brokers = list(brokers)
        self.heartbeat_interval = heartbeat_interval
        self.beats: dict[str, daemons_pb2.Heartbeat] = {}
        self.hellos: dict[str, daemons_pb2.Hello] = {}
        self._jobs: dict[str, list[daemons_pb2.JobSlots]] = defaultdict(list)
        self._sessions: dict[str, _Session] = {}
        self._version = 0
        self._sent: dict[str, int] = {}
        """The version of the last assignment sent to each daemon."""
        self._server: grpc.aio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        self._server = grpc.aio.server()
        daemons_pb2_grpc.add_DaemonServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)

    def connected(self, daemon_id: str) -> bool:
        return daemon_id in self._sessions

    def assign(self, daemon_id: str, *jobs: daemons_pb2.JobSlots) -> float:
        """Sends the daemon its complete assignment now; returns when (time.time()) it was sent."""
        self._version += 1
        self._sent[daemon_id] = self._version
        self._jobs[daemon_id] = list(jobs)
        self._push(daemon_id, self._assignment(daemon_id))
        return time.time()

    def drain(self, daemon_id: str) -> None:
        self._push(daemon_id, daemons_pb2.SchedulerMessage(drain=daemons_pb2.Drain()))

    def _assignment(self, daemon_id: str) -> daemons_pb2.SchedulerMessage:
        return daemons_pb2.SchedulerMessage(
            assignment=daemons_pb2.Assignment(version=self._version, jobs=self._jobs[daemon_id])
        )

    def _push(self, daemon_id: str, message: daemons_pb2.SchedulerMessage) -> None:
        session = self._sessions.get(daemon_id)
        if session is not None:
            session.outbox.put_nowait(message)

    async def ListDaemons(  # noqa: N802 - the gRPC method name
        self,
        request: daemons_pb2.ListDaemonsRequest,
        context: grpc.aio.ServicerContext[daemons_pb2.ListDaemonsRequest, daemons_pb2.ListDaemonsResponse],
    ) -> daemons_pb2.ListDaemonsResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the scripted scheduler lists no daemons")

    async def DrainDaemon(  # noqa: N802 - the gRPC method name
        self,
        request: daemons_pb2.DrainDaemonRequest,
        context: grpc.aio.ServicerContext[daemons_pb2.DrainDaemonRequest, daemons_pb2.DaemonInfo],
    ) -> daemons_pb2.DaemonInfo:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the scripted scheduler drains by script only")

    async def Connect(  # noqa: N802 - the gRPC method name
        self,
        request_iterator: AsyncIterator[daemons_pb2.DaemonMessage],
        context: grpc.aio.ServicerContext[daemons_pb2.DaemonMessage, daemons_pb2.SchedulerMessage],
    ) -> AsyncIterator[daemons_pb2.SchedulerMessage]:
        first = await anext(request_iterator)
        daemon_id = first.hello.daemon_id
        self.hellos[daemon_id] = first.hello
        session = self._sessions[daemon_id] = _Session()
        brokers = [common_pb2.Broker(url=url, name=f"b{i}") for i, url in enumerate(self.brokers)]
        yield daemons_pb2.SchedulerMessage(
            welcome=daemons_pb2.Welcome(brokers=brokers, heartbeat_interval=self.heartbeat_interval)
        )
        yield self._assignment(daemon_id)

        async def read() -> None:
            async for message in request_iterator:
                if message.HasField("heartbeat"):
                    self.beats[daemon_id] = message.heartbeat

        reader = asyncio.create_task(read())
        try:
            while not reader.done():
                with contextlib.suppress(TimeoutError):
                    yield await asyncio.wait_for(session.outbox.get(), 0.2)
        finally:
            reader.cancel()
            if self._sessions.get(daemon_id) is session:
                del self._sessions[daemon_id]

    def busy(self, daemon_id: str, job_id: str) -> int:
        """Slots of the daemon running the job's tasks, per its latest heartbeat."""
        stats = self.stats(daemon_id, job_id)
        return stats.busy_slots if stats is not None else 0

    def settled(self, daemon_id: str, job_id: str, busy: int) -> bool:
        """The daemon's latest heartbeat comes after its latest assignment and shows it running
        only ``job_id``, on ``busy`` busy slots (no other job's runner left, even a closing one).

        A heartbeat sent before the assignment arrived may show the wanted busy count as well:
        checking ``busy`` alone lets a test act while the daemon still runs the previous job.
        """
        beat = self.beats.get(daemon_id)
        if beat is None or beat.applied_version < self._sent.get(daemon_id, 0):
            return False
        others = [j.job_id for j in beat.running if j.job_id != job_id]
        return not others and self.busy(daemon_id, job_id) == busy

    def stats(self, daemon_id: str, job_id: str) -> daemons_pb2.JobStats | None:
        beat = self.beats.get(daemon_id)
        for stats in beat.stats if beat is not None else []:
            if stats.job_id == job_id:
                return stats
        return None


def job_slots(
    job: JobQueues,
    handler: str,
    slots: int,
    *,
    immediate: bool = False,
    task_timeout: float = 0.0,
    max_attempts: int = 0,
) -> daemons_pb2.JobSlots:
    """A JobSlots entry for an assignment, with the job's settings."""
    return daemons_pb2.JobSlots(
        job_id=job.job_id,
        handler=handler,
        slots=slots,
        queues=common_pb2.JobQueues(tasks=job.tasks, results=job.results, dead=job.dead),
        settings=common_pb2.JobSettings(
            preemption=common_pb2.PREEMPTION_IMMEDIATE if immediate else common_pb2.PREEMPTION_GRACEFUL,
            task_timeout=task_timeout,
            max_attempts=max_attempts,
            queue_type=common_pb2.QUEUE_TYPE_CLASSIC
            if job.kind == "classic"
            else common_pb2.QUEUE_TYPE_QUORUM,
        ),
    )


class DaemonProcess:
    """``python -m truba.daemon`` with its log in a file."""

    def __init__(self, log_dir: Path, daemon_id: str, scheduler: str, slots: int, *extra: str) -> None:
        self.daemon_id = daemon_id
        self.log_path = log_dir / f"{daemon_id}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        args = [sys.executable, "-m", "truba.daemon", "--scheduler", scheduler, "--id", daemon_id]
        args += ["--slots", str(slots), "--allow", ALLOW, "--log-level", "debug", *extra]
        self.popen = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the daemon; its slots see EOF on stdin and exit on their own."""
        if self.alive():
            self.popen.kill()
        self.popen.wait()
        self._log.close()

    async def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        code = self.popen.poll()
        if code is None:
            raise AssertionError(f"daemon {self.daemon_id} still running after {timeout} s")
        self._log.close()
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def slot_pids(self) -> list[int]:
        """Pids of the daemon's slot processes: its descendants (forked slots are children of the
        fork server's template, which is listed too)."""
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            children = Path(f"/proc/{pid}/task/{pid}/children")
            with contextlib.suppress(OSError):
                kids = [int(p) for p in children.read_text().split()]
                found += kids
                todo += kids
        return found


class JobQueues:
    """One job's queues on the brokers, and the client's side of them (see the module docstring)."""

    def __init__(
        self, job_id: str, broker_urls: Sequence[str], kind: str = "quorum", *, frame: int | None = FRAME
    ) -> None:
        self.job_id = job_id
        self.kind = kind
        prefix = f"truba.job.{job_id}"
        self.tasks, self.results, self.dead = f"{prefix}.tasks", f"{prefix}.results", f"{prefix}.dead"
        self.result_log = f"{prefix}.done"  # the daemon's results are copied there (truba.pipes.result_log)
        self.urls = list(broker_urls)
        self.links = [RabbitBroker(url, name=f"test-{job_id}", heartbeat=5.0) for url in self.urls]
        self.received: dict[str, list[ResultMessage]] = defaultdict(list)
        # Tasks submitted together go in frames (as a client's would): the daemon's tests run them.
        limits = None if frame is None else FrameLimits(max_messages=frame)
        self._sender = send_stack(
            TaskCodec(), self.links, self.tasks, role="test-tasks", frames=limits
        ).sender
        self._listener: Listener[ResultMessage] | None = None

    def specs(self) -> list[QueueSpec]:
        return [
            QueueSpec(self.dead, kind="classic"),
            QueueSpec(self.tasks, kind=self.kind, dead_letter_to=self.dead),
            QueueSpec(self.results, kind=self.kind, dead_letter_to=self.dead),
            QueueSpec(self.result_log, kind="stream"),
        ]

    async def declare(self) -> None:
        for url in self.urls:
            connection = await RabbitConnection.open(url, name="test-admin")
            try:
                for spec in self.specs():
                    await connection.declare(spec)
            finally:
                await connection.close()

    async def delete(self) -> None:
        with contextlib.suppress(Exception):
            await self._sender.close()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
        for url in self.urls:
            with contextlib.suppress(Exception):
                connection = await RabbitConnection.open(url, name="test-admin")
                try:
                    for spec in self.specs():
                        await connection.delete(spec.name)
                finally:
                    await connection.close()
        for link in self.links:
            await link.close()

    async def submit(self, *tasks: TaskMessage) -> None:
        """Publishes tasks and waits until the brokers confirmed them."""
        confirmations = [await self._sender.send(task) for task in tasks]
        await asyncio.gather(*confirmations)

    async def collect(
        self,
        task_ids: Sequence[str],
        timeout: float = 30.0,
        linger: float = 0.0,
        *,
        stall: float | None = None,
        stall_from: float | None = None,
    ) -> None:
        """Takes results (acking them) until every id has one, then ``linger`` s more for duplicates.

        Fails after ``timeout`` s, or, given ``stall``, once no new outcome came for ``stall`` s
        (counted from ``stall_from``, a ``time.monotonic()``, at the earliest; ``timeout`` then
        only caps the wait): a slow machine is no failure, a stuck task is.
        """
        if self._listener is None:
            self._listener = listen_stack(
                ResultCodec(), self.links, self.results, Window(200), role="test"
            ).listener
        began = time.monotonic()
        deadline = began + timeout
        missing = set(task_ids) - set(self.received)
        progressed = max(began, stall_from or began)
        while missing and time.monotonic() < deadline:
            if stall is not None and time.monotonic() - progressed > stall:
                break
            await self._take_one(0.2)
            left = set(task_ids) - set(self.received)
            if len(left) < len(missing):
                progressed = max(progressed, time.monotonic())
            missing = left
        if missing:
            waited = time.monotonic() - began
            raise AssertionError(
                f"{len(missing)} tasks have no outcome after {waited:.1f} s "
                f"(none came for {time.monotonic() - progressed:.1f} s): {sorted(missing)[:10]}"
            )
        end = time.monotonic() + linger
        while time.monotonic() < end:
            await self._take_one(0.1)

    async def _take_one(self, timeout: float) -> None:
        assert self._listener is not None
        delivery = await self._listener.get(timeout)
        if delivery is not None:
            self.received[delivery.message.task_id].append(delivery.message)
            await delivery.ack()

    def outcome(self, task_id: str) -> ResultMessage:
        """The client's outcome for a task: the first result that arrived (the rest are deduplicated)."""
        return self.received[task_id][0]

    def duplicates(self) -> int:
        return sum(len(results) - 1 for results in self.received.values())

    def counts(self) -> dict[str, int]:
        """Messages ready in each of the job's queues, summed over brokers (via pika)."""
        totals = {self.tasks: 0, self.results: 0, self.dead: 0}
        for url in self.urls:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            try:
                channel = connection.channel()
                for name in totals:
                    totals[name] += channel.queue_declare(name, passive=True).method.message_count or 0
            finally:
                connection.close()
        return totals

    def consumers(self) -> int:
        """Consumers of the task queue, summed over brokers (via pika)."""
        total = 0
        for url in self.urls:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            try:
                total += (
                    connection.channel().queue_declare(self.tasks, passive=True).method.consumer_count or 0
                )
            finally:
                connection.close()
        return total

    def take_dead(self) -> list[dict[str, object]]:
        """Every record in the dead-letter queue, decoded (taken with pika, a foreign client)."""
        records: list[dict[str, object]] = []
        for url in self.urls:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            try:
                channel = connection.channel()
                while True:
                    method, _, body = channel.basic_get(self.dead, auto_ack=True)
                    if method is None:
                        break
                    records.append(msgpack.unpackb(body, raw=False))
            finally:
                connection.close()
        return records

    def publish_raw(self, *bodies: bytes) -> None:
        """Publishes bytes straight into the task queue, as a foreign client would (pika, confirmed)."""
        connection = pika.BlockingConnection(pika.URLParameters(self.urls[0]))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            for body in bodies:
                channel.basic_publish("", self.tasks, body, pika.BasicProperties(delivery_mode=2))
        finally:
            connection.close()


@contextlib.asynccontextmanager
async def scripted(
    broker_urls: Sequence[str], log_dir: Path
) -> AsyncIterator[tuple[ScriptedScheduler, Callable[..., DaemonProcess]]]:
    """A scripted scheduler and a daemon starter; every daemon started is killed at the end."""
    scheduler = ScriptedScheduler(broker_urls)
    await scheduler.start()
    started: list[DaemonProcess] = []

    def start_daemon(daemon_id: str, slots: int, *extra: str) -> DaemonProcess:
        process = DaemonProcess(log_dir, daemon_id, scheduler.address, slots, *extra)
        started.append(process)
        return process

    try:
        yield scheduler, start_daemon
    finally:
        for process in started:
            if process.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                process.kill()
        await scheduler.stop()


def dump_logs(log_dir: Path, tail: int = 6000) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}" for p in sorted(log_dir.glob("*.log"))
    )
