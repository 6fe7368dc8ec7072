"""The scheduler under many daemons: its CPU at 1 heartbeat/s, and how fast assignments reach them.

One scheduler process (``python -m truba scheduler``, a RabbitMQ node started here for its queue
declarations) serves N simulated daemons over real gRPC: each is a ``DaemonService.Connect``
stream that says Hello (4 or 8 slots, ``allow=["*"]``), then sends a Heartbeat every second with
the version of the last Assignment it received, what it holds (``running``) and a JobStats per
held job. The daemons live in ``--workers`` processes (asyncio, ``--streams-per-channel`` streams
per gRPC channel, each channel its own TCP connection), so the simulator is not one GIL.

    python bench/scheduler_load.py [--daemons 1000 2000] [--seconds 20] [--rounds 5]
                                   [--streams-per-channel 1] [--workers 4] [--connect-rate 1000]
                                   [--phases connect,idle,...] [--profile]
                                   [--json bench/results/scheduler_load.json]

10,000 daemons on a 2-core machine (with the scheduler beside them):

    python bench/scheduler_load.py --daemons 2000 5000 10000 --seconds 15 --rounds 3 \
        --workers 2 --streams-per-channel 100 --connect-rate 1000

Per N, in order:
  connect      the N streams opened at --connect-rate per second (0: all at once); time until
               every daemon has its Welcome and first Assignment, and streams that failed
  idle         --seconds of heartbeats only, no job: scheduler CPU (utime+stime from /proc, in
               cores), simulator CPU, heartbeats/s the simulator managed to send, heartbeats/s
               the scheduler read (``ClusterInfo.heartbeats``) and its CPU µs per heartbeat read
               (robust to a shared machine), the load average
  empty        --rounds times: CreateJob on the empty cluster (the job takes every slot, so
               every daemon's assignment changes), wait until it reached all of them, then
               CancelJob likewise. Latency per daemon = arrival of the Assignment with (without)
               the job - start of the CreateJob (CancelJob) call, on CLOCK_MONOTONIC, which is
               system-wide on Linux, so comparable across processes
  busy         two background jobs hold the cluster and every heartbeat reports tasks done
               (1 task per slot per second): the scheduler's CPU when counters change on every
               heartbeat (each change asks for a replan)
  busy rounds  CreateJob / CancelJob while the background jobs run: the new job takes its fair
               share by moves; affected daemons = those whose assignment gained (lost) it.
               For every create also: the time from CreateJob's return to the last daemon,
               CreateJob's split as the scheduler logs it (declare_ms: the brokers'
               declarations; plan_ms: store, plan, pushes into outboxes; plan_cpu_ms: the same
               on the scheduler loop thread's CPU clock), the scheduler's CPU
               until the last daemon had the job, and that less the steady phase's CPU (what
               the propagation itself cost it); per scenario, the scheduler's CPU µs per
               assignment queued (``ClusterInfo.assignments``; an upper bound)
  disconnect   every stream cancelled at once (a fleet restart): time until the scheduler
               counts no daemon

Throughout, a thread here sends a health Check every 100 ms: its latency is how long the
scheduler's event loop stalls (everything shares that loop). The scheduler's CPU is also split
by thread, from /proc: its asyncio loop ("main") and gRPC's C-core threads.

Scheduler and simulator share this machine's cores: the simulator's CPU, RabbitMQ's, the
kernel's softirq time and the busiest foreign processes are reported next to the scheduler's,
so that a saturated or shared machine shows as such. The goal is the issue's: the scheduler
within half a core at 1 heartbeat/s. ``--profile`` samples the scheduler with py-spy (when on
PATH) during each phase and prints its hottest frames; sampling costs CPU too, so take the CPU
numbers from a run without it. ``--scheduler-log-level info`` keeps the scheduler's full log.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc, jobs_pb2, jobs_pb2_grpc

HANDLER: Final = "bench.noop:f"
CPU_GOAL: Final = 0.5
"""Scheduler CPU goal at 1 heartbeat/s, in cores (the issue's "within half a core")."""
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
QUIET: Final = 1.5
"""Seconds without a new arrival after which a propagation counts as complete."""
PROPAGATION_TIMEOUT: Final = 30.0
PHASES: Final = ("connect", "idle", "empty", "background", "busy", "busy_rounds", "disconnect")
SETTLE: Final = 3.0
"""Seconds to let the cluster settle between phases."""


# -- the simulated daemons (worker processes) ------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    address: str
    daemon_ids: list[str]
    slots: list[int]
    streams_per_channel: int
    connect_rate: float
    """Streams this worker opens per second (0: all at once)."""


@dataclass
class SimDaemon:
    daemon_id: str
    slots: int
    version: int = 0
    jobs: dict[str, int] = field(default_factory=dict)
    """What its last Assignment gave it: job id -> slots."""
    done: dict[str, int] = field(default_factory=dict)
    connect_started: float = 0.0
    first_assignment: float | None = None
    heartbeat_interval: float = 1.0
    beat: daemons_pb2.DaemonMessage | None = None
    """The last heartbeat built, sent again while nothing changed (the simulator's own cost)."""
    beat_key: tuple[int, dict[str, int]] | None = None


@dataclass
class Arrival:
    """When a job appeared in (or left) a daemon's assignment."""

    daemon_id: str
    at: float


class Simulator:
    """The daemons of one worker process and what they saw."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.daemons = [SimDaemon(d, s) for d, s in zip(spec.daemon_ids, spec.slots, strict=True)]
        self.advance = False
        """Count tasks done on every heartbeat (the busy phase)."""
        self.added: dict[str, list[Arrival]] = collections.defaultdict(list)
        self.removed: dict[str, list[Arrival]] = collections.defaultdict(list)
        self.heartbeats = 0
        self.lags: list[float] = []
        self.assignments = 0
        self.ends: collections.Counter[str] = collections.Counter()
        self.end_times: list[float] = []
        self.reconnects = 0
        self.channels: list[grpc.aio.Channel] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks.append(asyncio.create_task(self._start()))

    async def _start(self) -> None:
        """Opens the streams at ``connect_rate`` per second, in steps of 10 ms (a fleet coming
        up, not 10,000 Hellos in one instant; at 0, all at once)."""
        per = self.spec.streams_per_channel
        rate = self.spec.connect_rate
        began = time.monotonic()
        opened = 0
        for first in range(0, len(self.daemons), per):
            # A local subchannel pool: every channel object its own TCP connection (channels with
            # equal arguments would otherwise share one).
            channel = grpc.aio.insecure_channel(
                self.spec.address, options=[("grpc.use_local_subchannel_pool", 1)]
            )
            self.channels.append(channel)
            stub = daemons_pb2_grpc.DaemonServiceStub(channel)
            for daemon in self.daemons[first : first + per]:
                if rate > 0:
                    ahead = began + opened / rate - time.monotonic()
                    if ahead > 0.01:
                        await asyncio.sleep(ahead)
                self.tasks.append(asyncio.create_task(self.run(daemon, stub)))
                opened += 1

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for channel in self.channels:
            await channel.close(None)

    async def run(self, daemon: SimDaemon, stub: daemons_pb2_grpc.DaemonServiceStub) -> None:
        """One daemon: connect, heartbeat, apply assignments; reconnect like a daemon would."""
        attempt = 0
        while True:
            daemon.connect_started = time.monotonic()
            try:
                await self.session(daemon, stub)
                self.ends["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                self.ends[f"{exc.code().name}: {(exc.details() or '')[:80]}"] += 1
            self.end_times.append(time.monotonic())
            attempt += 1
            self.reconnects += 1
            await asyncio.sleep(min(5.0, attempt) * random.uniform(0.5, 1.5))

    async def session(self, daemon: SimDaemon, stub: daemons_pb2_grpc.DaemonServiceStub) -> None:
        # grpc-stubs types the stub as a blocking one; this is the aio StreamStreamCall (write/read).
        call: Any = stub.Connect()  # type: ignore[call-arg]
        beating: asyncio.Task[None] | None = None
        try:
            hello = daemons_pb2.Hello(
                daemon_id=daemon.daemon_id,
                hostname=f"host-{daemon.daemon_id}",
                pid=os.getpid(),
                slots=daemon.slots,
                allow=["*"],
                version="bench",
                running=[daemons_pb2.JobSlots(job_id=j, slots=n) for j, n in daemon.jobs.items()],
            )
            await call.write(daemons_pb2.DaemonMessage(hello=hello))
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:  # type: ignore[attr-defined]
                    return
                assert isinstance(message, daemons_pb2.SchedulerMessage)
                kind = message.WhichOneof("kind")
                if kind == "welcome":
                    daemon.heartbeat_interval = message.welcome.heartbeat_interval or 1.0
                    if beating is None:
                        beating = asyncio.create_task(self.beat(daemon, call))
                elif kind == "assignment":
                    self.apply(daemon, message.assignment)
        finally:
            if beating is not None:
                beating.cancel()
            call.cancel()

    def apply(self, daemon: SimDaemon, assignment: daemons_pb2.Assignment) -> None:
        now = time.monotonic()
        self.assignments += 1
        if daemon.first_assignment is None:
            daemon.first_assignment = now
        jobs = {j.job_id: j.slots for j in assignment.jobs if j.slots > 0}
        for job_id in jobs.keys() - daemon.jobs.keys():
            self.added[job_id].append(Arrival(daemon.daemon_id, now))
        for job_id in daemon.jobs.keys() - jobs.keys():
            self.removed[job_id].append(Arrival(daemon.daemon_id, now))
        daemon.jobs = jobs
        daemon.version = assignment.version
        if assignment.heartbeat_interval > 0:  # the scheduler stretched it (its heartbeat budget)
            daemon.heartbeat_interval = assignment.heartbeat_interval

    async def beat(self, daemon: SimDaemon, call: Any) -> None:
        """Heartbeats on ``call`` (an aio StreamStreamCall) every interval, from a random phase."""
        interval = daemon.heartbeat_interval
        due = time.monotonic() + random.uniform(0, interval)  # spread the daemons over the second
        while True:
            interval = daemon.heartbeat_interval  # as the scheduler last told it
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            self.lags.append(now - due)
            due = max(due + interval, now)  # more than one interval behind: start again from now
            if not self.advance and daemon.beat_key == (daemon.version, daemon.jobs):
                message = daemon.beat  # nothing changed: the same bytes again, built once
            else:
                stats = []
                for job_id, slots in daemon.jobs.items():
                    if self.advance:
                        daemon.done[job_id] = daemon.done.get(job_id, 0) + slots
                    stats.append(
                        daemons_pb2.JobStats(
                            job_id=job_id,
                            done=daemon.done.get(job_id, 0),
                            busy_slots=slots if self.advance else 0,
                            service_time=1.0 if self.advance else 0.0,
                        )
                    )
                heartbeat = daemons_pb2.Heartbeat(
                    applied_version=daemon.version,
                    running=[daemons_pb2.JobSlots(job_id=j, slots=n) for j, n in daemon.jobs.items()],
                    stats=stats,
                )
                message = daemon.beat = daemons_pb2.DaemonMessage(heartbeat=heartbeat)
                daemon.beat_key = (daemon.version, dict(daemon.jobs))
            await call.write(message)
            self.heartbeats += 1

    # -- commands from the main process -----------------------------------------------------------

    def answer(self, command: tuple[Any, ...]) -> object:
        name = command[0]
        if name == "connected":
            times = [
                (d.connect_started, d.first_assignment)
                for d in self.daemons
                if d.first_assignment is not None
            ]
            return times
        if name in ("count", "arrivals"):
            _, job_id, kind, since = command
            arrivals = (self.added if kind == "add" else self.removed).get(job_id, [])
            first: dict[str, float] = {}
            for arrival in arrivals:
                if arrival.at >= since and arrival.daemon_id not in first:
                    first[arrival.daemon_id] = arrival.at
            return len(first) if name == "count" else first
        if name == "holding":
            return sum(command[1] in d.jobs for d in self.daemons)
        if name == "advance":
            self.advance = bool(command[1])
            return None
        if name == "counters":
            lags, self.lags = self.lags, []
            counters = {
                "heartbeats": self.heartbeats,
                "assignments": self.assignments,
                "reconnects": self.reconnects,
                "ends": dict(self.ends),
                "end_times": self.end_times,
                "lags": lags,
            }
            return counters
        raise ValueError(f"unknown command {name!r}")


def worker_main(spec: WorkerSpec, conn: multiprocessing.connection.Connection) -> None:
    """A worker process: runs its daemons, answers the main process's commands until "stop"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides when we stop
    asyncio.run(_worker(spec, conn))


async def _worker(spec: WorkerSpec, conn: multiprocessing.connection.Connection) -> None:
    simulator = Simulator(spec)
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def on_command() -> None:
        while conn.poll():
            command = conn.recv()
            if command[0] == "connect":
                simulator.start()
                conn.send(None)
            elif command[0] == "stop":
                loop.remove_reader(conn.fileno())
                stopped.set()
                return
            else:
                conn.send(simulator.answer(command))

    loop.add_reader(conn.fileno(), on_command)
    conn.send("ready")
    await stopped.wait()
    await simulator.stop()
    conn.send("stopped")


class Workers:
    """The worker processes of one run, and a request/answer exchange with all of them."""

    def __init__(
        self, address: str, n: int, processes: int, streams_per_channel: int, connect_rate: float
    ) -> None:
        context = multiprocessing.get_context("spawn")
        ids = [f"sim-{i:05d}" for i in range(n)]
        slots = [4 if i % 2 == 0 else 8 for i in range(n)]
        self.total_slots = sum(slots)
        self.conns: list[multiprocessing.connection.Connection] = []
        self.processes: list[multiprocessing.process.BaseProcess] = []
        for w in range(processes):
            spec = WorkerSpec(
                w,
                address,
                ids[w::processes],
                slots[w::processes],
                streams_per_channel,
                connect_rate / processes,
            )
            parent, child = context.Pipe()
            process = context.Process(target=worker_main, args=(spec, child), name=f"sim-{w}", daemon=True)
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)
        for conn in self.conns:
            if not conn.poll(60) or conn.recv() != "ready":
                raise RuntimeError("a simulator worker did not start")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def ask(self, *command: object) -> list[Any]:
        for conn in self.conns:
            conn.send(command)
        return [conn.recv() for conn in self.conns]

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for conn, process in zip(self.conns, self.processes, strict=True):
            with contextlib.suppress(OSError, EOFError):
                if conn.poll(15):
                    conn.recv()
            process.join(5)
            if process.is_alive():
                process.kill()  # one of ours, by its own handle
                process.join()


# -- the scheduler process -------------------------------------------------------------------------


class SchedulerProcess:
    """``python -m truba scheduler`` on a free port; stderr goes to a file we summarise later."""

    def __init__(
        self,
        broker: str,
        state: Path,
        log: Path,
        heartbeat_interval: float,
        log_level: str = "warning",
        heartbeat_budget: float | None = None,
    ) -> None:
        self.log_path = log
        self._log: IO[bytes] = log.open("wb")
        command = [
            sys.executable,
            "-m",
            "truba",
            "scheduler",
            "--listen",
            "127.0.0.1:0",
            "--broker",
            broker,
            "--state",
            str(state),
            "--heartbeat-interval",
            f"{heartbeat_interval:g}",
            "--log-level",
            log_level,
            *(["--heartbeat-budget", f"{heartbeat_budget:g}"] if heartbeat_budget is not None else []),
        ]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.wait(10)
            self._log.close()
            raise RuntimeError(f"the scheduler did not start: {log.read_text()[-3000:]}")
        self.address = line.split()[-1]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def created(self, job_id: str) -> dict[str, float]:
        """CreateJob's split as the scheduler logged it (``--scheduler-log-level info``): the
        brokers' declarations, then the store, the plan and its pushes into outboxes (ms)."""
        self._log.flush()
        with self.log_path.open(errors="replace") as log:
            for line in log:
                if job_id in line and "sched.job.created" in line:
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        return {k: record[k] for k in ("declare_ms", "plan_ms", "plan_cpu_ms") if k in record}
        return {}

    def log_summary(self) -> dict[str, object]:
        """Counts of the scheduler's stderr lines by level and event, and the last few."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        by_event: collections.Counter[str] = collections.Counter()
        for line in lines:
            try:
                record = json.loads(line)
                what = record.get("details") or record.get("reason") or record.get("error") or ""
                event = record.get("event") or record.get("msg", "?")
                by_event[f"{record.get('level', '?')} {event} {what}"[:200]] += 1
            except (ValueError, AttributeError):
                by_event["(not json)"] += 1
        return {"lines": len(lines), "by_event": dict(by_event.most_common(20)), "tail": lines[-10:]}


# -- measuring -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, seconds (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads, summed by thread name ("main" for the main thread):
    the asyncio loop runs on the main thread, gRPC's C core on its ``event_engine`` threads."""
    by_name: dict[str, float] = collections.defaultdict(float)
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            name = "main" if stat.parent.name == str(pid) else text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rpartition(")")[2].split()
            by_name[name] += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return by_name


def all_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (command name, CPU seconds) of every process on the machine."""
    seen: dict[int, tuple[str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rpartition(")")[2].split()
            seen[int(stat.parent.name)] = (name, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return seen


def others(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], ours: set[int], seconds: float
) -> list[tuple[str, int, float]]:
    """The busiest processes that are not ours over a window: (name, pid, cores), top 5."""
    busy = [
        (name, pid, round((cpu - before.get(pid, (name, 0.0))[1]) / seconds, 3))
        for pid, (name, cpu) in after.items()
        if pid not in ours
    ]
    return sorted((b for b in busy if b[2] >= 0.01), key=lambda b: -b[2])[:5]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine_times() -> list[int]:
    """The machine's jiffies from /proc/stat: user nice system idle iowait irq softirq steal."""
    return [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]


def machine_cores(before: list[int], after: list[int]) -> dict[str, float]:
    """Busy cores of the whole machine between two :func:`machine_times`, by kind: softirq is
    mostly the kernel's network stack (loopback TCP here), charged to no process."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    cores = (os.cpu_count() or 1) / max(1, sum(delta))
    user, nice, system, idle, iowait, irq, softirq, steal = delta
    return {
        "busy": round((sum(delta) - idle - iowait) * cores, 3),
        "user": round((user + nice) * cores, 3),
        "system": round(system * cores, 3),
        "softirq": round((irq + softirq) * cores, 3),
        "steal": round(steal * cores, 3),
    }


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50": round(pct(ms, 50), 1),
        "p95": round(pct(ms, 95), 1),
        "p99": round(pct(ms, 99), 1),
        "max": round(max(ms), 1) if ms else float("nan"),
    }


class Prober(threading.Thread):
    """A health Check every 100 ms: its latency shows how long the scheduler's event loop stalls
    (the health service answers on the same loop as everything else)."""

    def __init__(self, address: str) -> None:
        super().__init__(name="probe", daemon=True)
        self._channel = grpc.insecure_channel(address)
        self._stub = health_pb2_grpc.HealthStub(self._channel)
        self._halt = threading.Event()
        self.samples: list[tuple[float, float]] = []
        """(start, seconds) of each Check; seconds = inf when it failed."""

    def run(self) -> None:
        while not self._halt.is_set():
            began = time.monotonic()
            try:
                self._stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
                self.samples.append((began, time.monotonic() - began))
            except grpc.RpcError:
                self.samples.append((began, float("inf")))
            self._halt.wait(max(0.0, began + 0.1 - time.monotonic()))

    def stop(self) -> None:
        self._halt.set()
        self.join(15)
        self._channel.close()

    def between(self, start: float, end: float) -> dict[str, float]:
        return summary_ms([seconds for at, seconds in list(self.samples) if start <= at < end])


class Profiler:
    """py-spy sampling the scheduler until :meth:`hot` (raw collapsed stacks), if py-spy is there.

    Blocking mode (py-spy pauses the process for each sample, 100 times a second): accurate
    stacks and idle detection, at some cost to the process measured.
    """

    BOILERPLATE: Final = ("asyncio/", "runpy", "threading.py", "truba/__main__.py", "cli.py")
    WAITING: Final = ("EpollSelector.select ", "Thread.run ")
    """Leaves py-spy counts as busy that are waits: the loop's epoll, gRPC's C-core threads (their
    own CPU is in ``scheduler_threads_cores``, from /proc)."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(exe).exists():
            return
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def hot(self, top: int = 15) -> dict[str, object] | None:
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not self.out.exists():
            return None
        own: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        total = waiting = 0
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            frames = [f for f in stack.split(";") if f]
            if not frames or any(_short(frames[-1]).startswith(w) for w in self.WAITING):
                waiting += n
                continue
            total += n
            own[_short(frames[-1])] += n
            for frame in {_short(f) for f in frames}:
                if not any(b in frame for b in self.BOILERPLATE):
                    inclusive[frame] += n
        if not total:
            return None

        def share(counter: collections.Counter[str]) -> list[tuple[str, float]]:
            return [(f, round(n / total, 3)) for f, n in counter.most_common(top)]

        return {
            "samples": total,
            "waiting_samples": waiting,
            "file": str(self.out),
            "own": share(own),
            "inclusive": share(inclusive),
        }


def _short(frame: str) -> str:
    """``func (path/to/module.py:12)`` -> ``func (module.py)``: lines merged per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0] or where.rstrip(")")
    return f"{name} ({'/'.join(Path(path).parts[-2:])})"


@dataclass
class Run:
    """One N: the scheduler, its workers and the gRPC stubs the main process drives it with."""

    n: int
    args: argparse.Namespace
    scheduler: SchedulerProcess
    workers: Workers
    jobs: jobs_pb2_grpc.JobServiceStub
    daemons: daemons_pb2_grpc.DaemonServiceStub
    out_dir: Path
    broker_pid: int
    probe: Prober
    background_ids: list[str] = field(default_factory=list)
    steady_cores: float = 0.0
    """The scheduler's cores in the last steady window (heartbeats and flushes: not a propagation's)."""
    create_retries: int = 0
    """CreateJob calls tried again after UNAVAILABLE (the broker's declaration timed out)."""

    def sched_counts(self) -> tuple[int, int]:
        """(heartbeats read, assignments queued) as the scheduler counts them (GetClusterInfo)."""
        info = self.jobs.GetClusterInfo(jobs_pb2.GetClusterInfoRequest(), timeout=30)
        return info.heartbeats, info.assignments

    def check_alive(self) -> None:
        if not self.scheduler.alive():
            raise RuntimeError(f"the scheduler exited with {self.scheduler.proc.returncode}")

    def counters(self) -> dict[str, Any]:
        """Sums the workers' counters (and takes their heartbeat lags since the last call)."""
        answers = self.workers.ask("counters")
        ends: collections.Counter[str] = collections.Counter()
        for answer in answers:
            ends.update(answer["ends"])
        return {
            "heartbeats": sum(a["heartbeats"] for a in answers),
            "assignments": sum(a["assignments"] for a in answers),
            "reconnects": sum(a["reconnects"] for a in answers),
            "ends": dict(ends),
            "end_times": sorted(t for a in answers for t in a["end_times"]),
            "lags": [lag for a in answers for lag in a["lags"]],
        }

    def disconnect(self) -> dict[str, object]:
        """Every daemon goes at once (the workers cancel their streams and close their channels):
        time until the scheduler counts no daemon (GetClusterInfo)."""
        profiler = self.profiler("disconnect")
        before = cpu_seconds(self.scheduler.pid)
        began = time.monotonic()
        self.workers.stop()
        stopped = time.monotonic() - began
        left = -1
        while time.monotonic() < began + 60:
            left = self.jobs.GetClusterInfo(jobs_pb2.GetClusterInfoRequest(), timeout=30).daemons
            if left == 0:
                break
            time.sleep(0.1)
        result: dict[str, object] = {
            "simulator_stopped_s": round(stopped, 2),
            "all_gone_s": round(time.monotonic() - began, 2) if left == 0 else None,
            "left": left,
            "scheduler_cpu_s": round(cpu_seconds(self.scheduler.pid) - before, 2),
            "probe_ms": self.probe.between(began, time.monotonic()),
        }
        if profiler is not None:
            result["profile"] = profiler.hot()
        return result

    def connect(self) -> dict[str, object]:
        profiler = self.profiler("connect")
        before = cpu_seconds(self.scheduler.pid)
        began = time.monotonic()
        self.workers.ask("connect")
        deadline = began + self.args.connect_timeout
        connected: list[tuple[float, float]] = []
        while time.monotonic() < deadline:
            time.sleep(0.2)
            self.check_alive()
            connected = [t for times in self.workers.ask("connected") for t in times]
            if len(connected) >= self.n:
                break
        done = [first for _, first in connected]
        own = [first - started for started, first in connected]
        result: dict[str, object] = {
            "connected": len(connected),
            "all_s": round(max(done) - began, 3) if len(connected) >= self.n else None,
            "half_s": round(pct(done, 50) - began, 3) if done else None,
            "per_daemon_ms": summary_ms(own),
            "scheduler_cpu_s": round(cpu_seconds(self.scheduler.pid) - before, 2),
            "probe_ms": self.probe.between(began, time.monotonic()),
        }
        counters = self.counters()
        result["stream_ends"] = counters["ends"]
        result["stream_end_at_s"] = [round(t - began, 2) for t in counters["end_times"]][:50]
        result["reconnects"] = counters["reconnects"]
        listing = self.daemons.ListDaemons(daemons_pb2.ListDaemonsRequest(), timeout=60)
        result["scheduler_sees"] = len(listing.daemons)
        if profiler is not None:
            result["profile"] = profiler.hot()
        if len(connected) < self.n:
            result["problem"] = f"only {len(connected)} of {self.n} daemons connected within the timeout"
        return result

    def window(self, phase: str) -> dict[str, object]:
        """Steady state for --seconds: CPU of the scheduler and of the simulator, heartbeats sent."""
        seconds = self.args.seconds
        profiler = self.profiler(phase)
        sim_pids = [*self.workers.pids, os.getpid()]
        ours = {*sim_pids, self.scheduler.pid, self.broker_pid}
        everyone0 = all_cpu()
        threads0 = thread_cpu(self.scheduler.pid)
        c0 = self.counters()
        done0 = self.done()
        h0, a0 = self.sched_counts()
        s0, w0, b0, m0, t0 = (
            cpu_seconds(self.scheduler.pid),
            sum(cpu_seconds(p) for p in sim_pids),
            cpu_seconds(self.broker_pid),
            machine_times(),
            time.monotonic(),
        )
        time.sleep(seconds)
        s1, w1, b1, m1, t1 = (
            cpu_seconds(self.scheduler.pid),
            sum(cpu_seconds(p) for p in sim_pids),
            cpu_seconds(self.broker_pid),
            machine_times(),
            time.monotonic(),
        )
        h1, a1 = self.sched_counts()
        everyone1 = all_cpu()
        threads1 = thread_cpu(self.scheduler.pid)
        c1 = self.counters()
        done1 = self.done()
        self.check_alive()
        elapsed = t1 - t0
        received = h1 - h0
        result: dict[str, object] = {
            "seconds": round(elapsed, 2),
            "loadavg": os.getloadavg(),
            "scheduler_cores": round((s1 - s0) / elapsed, 3),
            "heartbeats_received_per_s": round(received / elapsed, 1),
            # Robust to a shared machine: the scheduler's CPU over the heartbeats it read (all of
            # its work in the window, its plans and pushes too, so an upper bound per heartbeat).
            "scheduler_cpu_us_per_heartbeat": round((s1 - s0) / received * 1e6, 1) if received else None,
            "assignments_queued": a1 - a0,
            "scheduler_threads_cores": {
                name: round((cpu - threads0.get(name, 0.0)) / elapsed, 3)
                for name, cpu in sorted(threads1.items(), key=lambda t: -t[1])
            },
            "simulator_cores": round((w1 - w0) / elapsed, 3),
            "rabbitmq_cores": round((b1 - b0) / elapsed, 3),
            "other_processes": others(everyone0, everyone1, ours, elapsed),
            "machine_cores": machine_cores(m0, m1),
            "heartbeats_per_s": round((c1["heartbeats"] - c0["heartbeats"]) / elapsed, 1),
            "probe_ms": self.probe.between(t0, t1),
            "heartbeat_lag_ms": summary_ms(c1["lags"]),
            "assignments_received": c1["assignments"] - c0["assignments"],
            "reconnects": c1["reconnects"] - c0["reconnects"],
            "stream_ends_so_far": c1["ends"],
            "scheduler_rss_mb": round(rss_mb(self.scheduler.pid), 1),
            # Tasks done per second as the scheduler counts them (GetJob): the busy phase's
            # reports do reach it.
            "reported_done_per_s": round((done1 - done0) / elapsed, 1),
        }
        self.steady_cores = cast(float, result["scheduler_cores"])
        if self.background_ids:
            result["background_jobs"] = [self.job_brief(j) for j in self.background_ids]
        if profiler is not None:
            result["profile"] = profiler.hot()
        return result

    def propagate(
        self, job_id: str, kind: str, since: float, expected: int | None, cpu_since: float | None = None
    ) -> dict[str, object]:
        """Waits until ``expected`` daemons saw ``job_id`` added (removed), at most
        PROPAGATION_TIMEOUT; with no ``expected``, until none more came for QUIET s.

        With ``cpu_since`` (the scheduler's CPU seconds at ``since``), also the scheduler's CPU
        until the last daemon had it (sampled every 0.1 s), and that less the steady phase's
        CPU over the same time: what the propagation itself cost the scheduler, which on a core
        of its own would bound its wall time (the broker's declarations excepted: I/O)."""
        deadline = since + PROPAGATION_TIMEOUT
        count, changed = 0, time.monotonic()
        samples: list[tuple[float, float]] = []
        while time.monotonic() < deadline:
            time.sleep(0.1)
            samples.append((time.monotonic(), cpu_seconds(self.scheduler.pid)))
            now_count = sum(self.workers.ask("count", job_id, kind, since))
            if now_count != count:
                count, changed = now_count, time.monotonic()
            if expected is not None and count >= expected:
                break
            if expected is None and count and time.monotonic() - changed >= QUIET:
                break  # an unknown count: done when none more came for QUIET s
        arrivals: dict[str, float] = {}
        for answer in self.workers.ask("arrivals", job_id, kind, since):
            arrivals.update(answer)
        latencies = sorted(at - since for at in arrivals.values())
        result: dict[str, object] = {
            "daemons": len(latencies),
            "expected": expected,
            "first_ms": round(latencies[0] * 1000, 1) if latencies else None,
            "all_ms": round(latencies[-1] * 1000, 1) if latencies else None,
            "latencies": latencies,
        }
        if cpu_since is not None and latencies:
            last = since + latencies[-1]
            cpu = next((c for t, c in samples if t >= last), None)
            if cpu is not None:
                spent = cpu - cpu_since
                result["cpu_to_all_s"] = round(spent, 3)
                result["own_cpu_to_all_s"] = round(spent - self.steady_cores * latencies[-1], 3)
        if expected is not None and len(latencies) < expected:
            result["problem"] = f"{len(latencies)} of {expected} daemons within {PROPAGATION_TIMEOUT:g}s"
        return result

    def profiler(self, phase: str) -> Profiler | None:
        if not self.args.profile:
            return None
        return Profiler(self.scheduler.pid, self.out_dir / f"pyspy-{self.n}-{phase}.txt")

    def done(self) -> int:
        """Tasks done over the background jobs, as the scheduler counts them."""
        return sum(
            self.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=j), timeout=30).counts.done
            for j in self.background_ids
        )

    def job_brief(self, job_id: str) -> dict[str, object]:
        job = self.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id), timeout=30)
        return {
            "id": job.id,
            "importance": job.importance,
            "assigned_slots": job.assigned_slots,
            "fair_share": round(job.fair_share, 1),
        }

    def holders(self, job_id: str) -> int:
        """Daemons that the scheduler says hold ``job_id`` (ListDaemons)."""
        listing = self.daemons.ListDaemons(daemons_pb2.ListDaemonsRequest(), timeout=30)
        return sum(any(a.job_id == job_id and a.slots > 0 for a in d.assigned) for d in listing.daemons)

    def rounds(self, scenario: str, importance: float) -> dict[str, object]:
        """--rounds times CreateJob then CancelJob, each until it reached the daemons it changes."""
        creates: list[dict[str, object]] = []
        cancels: list[dict[str, object]] = []
        create_rpc: list[float] = []
        cancel_rpc: list[float] = []
        profiler = self.profiler(scenario)
        cpu_before = cpu_seconds(self.scheduler.pid)
        h0, a0 = self.sched_counts()
        began = time.monotonic()
        for i in range(self.args.rounds):
            request = jobs_pb2.CreateJobRequest(
                handler=HANDLER, importance=importance, name=f"{scenario}-{i}"
            )
            cpu0 = cpu_seconds(self.scheduler.pid)
            t0, job = self.create(request)
            returned = time.monotonic()
            create_rpc.append(returned - t0)
            everyone = self.n if scenario == "empty" else None
            added = self.propagate(job.id, "add", t0, everyone, cpu0)
            added["after_return_ms"] = (
                round(cast(float, added["all_ms"]) - (returned - t0) * 1000, 1)
                if added["all_ms"] is not None
                else None
            )
            added["scheduler_cpu_s"] = round(cpu_seconds(self.scheduler.pid) - cpu0, 3)
            added["loadavg_1m"] = os.getloadavg()[0]
            added.update(self.scheduler.created(job.id))
            time.sleep(0.5)  # hold time: the new job's slots may be taken back only after this
            added["scheduler_holders"] = self.holders(job.id)
            added["job_slots"] = self.jobs.GetJob(
                jobs_pb2.GetJobRequest(job_id=job.id), timeout=30
            ).assigned_slots
            holding = sum(self.workers.ask("holding", job.id))
            t1 = time.monotonic()
            self.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id), timeout=60)
            cancel_rpc.append(time.monotonic() - t1)
            removed = self.propagate(job.id, "remove", t1, holding)
            creates.append(added)
            cancels.append(removed)
            self.check_alive()
            time.sleep(1.0)
        elapsed = time.monotonic() - began
        h1, a1 = self.sched_counts()
        result: dict[str, object] = {
            "create": _rounds_summary(creates, create_rpc),
            "cancel": _rounds_summary(cancels, cancel_rpc),
            "loadavg": os.getloadavg(),
            "scheduler_cpu_s": round(cpu_seconds(self.scheduler.pid) - cpu_before, 2),
            "heartbeats_received": h1 - h0,
            "assignments_queued": a1 - a0,
            "scheduler_cores": round((cpu_seconds(self.scheduler.pid) - cpu_before) / elapsed, 3),
            "probe_ms": self.probe.between(began, began + elapsed),
        }
        if profiler is not None:
            result["profile"] = profiler.hot()
        return result

    def create(self, request: jobs_pb2.CreateJobRequest) -> tuple[float, jobs_pb2.Job]:
        """CreateJob, tried again (up to 3 times) when the broker's declaration timed out (a
        saturated shared machine): returns when the call that succeeded started, and the job."""
        for attempt in range(3):
            began = time.monotonic()
            try:
                return began, self.jobs.CreateJob(request, timeout=60).job
            except grpc.RpcError as exc:
                if attempt == 2 or exc.code() is not grpc.StatusCode.UNAVAILABLE:
                    raise
                self.create_retries += 1
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def background(self) -> list[str]:
        """Two jobs that hold the cluster (importance 1 and 2) for the busy phase."""
        ids = []
        for importance in (1.0, 2.0):
            request = jobs_pb2.CreateJobRequest(handler=HANDLER, importance=importance, name="background")
            t0, job = self.create(request)
            self.propagate(job.id, "add", t0, None)
            ids.append(job.id)
        self.background_ids = ids
        return ids


def _rounds_summary(rounds: list[dict[str, object]], rpc: list[float]) -> dict[str, object]:
    latencies = [lat for r in rounds for lat in cast(list[float], r.pop("latencies"))]
    alls = [cast(float, r["all_ms"]) for r in rounds if r["all_ms"] is not None]
    after = [cast(float, r["after_return_ms"]) for r in rounds if r.get("after_return_ms") is not None]
    return {
        "all_after_return_ms": {"median": round(pct(after, 50), 1), "max": max(after)} if after else None,
        "declare_ms": [r.get("declare_ms") for r in rounds if "declare_ms" in r],
        "plan_ms": [r.get("plan_ms") for r in rounds if "plan_ms" in r],
        "plan_cpu_ms": [r.get("plan_cpu_ms") for r in rounds if "plan_cpu_ms" in r],
        "scheduler_cpu_s": [r.get("scheduler_cpu_s") for r in rounds if "scheduler_cpu_s" in r],
        "cpu_to_all_s": [r.get("cpu_to_all_s") for r in rounds if "cpu_to_all_s" in r],
        "own_cpu_to_all_s": [r.get("own_cpu_to_all_s") for r in rounds if "own_cpu_to_all_s" in r],
        "loadavg_1m": [r.get("loadavg_1m") for r in rounds if "loadavg_1m" in r],
        "daemons_per_round": [r["daemons"] for r in rounds],
        "scheduler_holders": [r.get("scheduler_holders") for r in rounds if "scheduler_holders" in r],
        "job_slots": [r.get("job_slots") for r in rounds if "job_slots" in r],
        "per_daemon_ms": summary_ms(latencies),
        "all_reached_ms": {"median": round(pct(alls, 50), 1), "max": max(alls)} if alls else None,
        "rpc_ms": summary_ms(rpc),
        "problems": [r["problem"] for r in rounds if "problem" in r],
        "rounds": rounds,
    }


def scheduler_source() -> str:
    """A fingerprint of the scheduler's source as this run imports it (it may be mid-edit)."""
    import hashlib

    import truba.scheduler

    digest = hashlib.sha256()
    for path in sorted(Path(truba.scheduler.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def run_size(n: int, args: argparse.Namespace, broker: str, broker_pid: int, base: Path) -> dict[str, object]:
    """Everything for N daemons on a fresh scheduler (new state directory)."""
    print(f"\n== {n} daemons", file=sys.stderr)
    run_dir = base / f"n{n}"
    run_dir.mkdir()
    scheduler = SchedulerProcess(
        broker,
        run_dir / "state",
        run_dir / "scheduler.log",
        1.0,
        args.scheduler_log_level,
        args.heartbeat_budget,
    )
    result: dict[str, object] = {
        "daemons": n,
        "scheduler_log": str(run_dir / "scheduler.log"),
        "scheduler_source": scheduler_source(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    workers: Workers | None = None
    channel = grpc.insecure_channel(scheduler.address)
    probe = Prober(scheduler.address)
    probe.start()
    try:
        workers = Workers(scheduler.address, n, args.workers, args.streams_per_channel, args.connect_rate)
        result["slots"] = workers.total_slots
        run = Run(
            n,
            args,
            scheduler,
            workers,
            jobs_pb2_grpc.JobServiceStub(channel),
            daemons_pb2_grpc.DaemonServiceStub(channel),
            args.json.parent,
            broker_pid,
            probe,
        )

        def busy() -> dict[str, object]:
            run.workers.ask("advance", True)  # from now on every heartbeat reports tasks done
            time.sleep(SETTLE)
            return run.window("busy")

        steps: list[tuple[str, Callable[[], object]]] = [
            ("connect", run.connect),
            ("idle", lambda: run.window("idle")),
            ("empty", lambda: run.rounds("empty", 1.0)),
            ("background", run.background),
            ("busy", busy),
            ("busy_rounds", lambda: run.rounds("busy", 1.0)),
            ("disconnect", run.disconnect),
        ]
        wanted = {"connect", *args.phases.split(",")}
        for name, step in steps:
            if name not in wanted:
                continue
            print(f"  {name} ...", file=sys.stderr)
            value = result[name] = step()
            _progress(name, value)
            if name == "connect":
                if isinstance(value, dict) and "problem" in value:
                    break
                time.sleep(SETTLE)
        result["create_retries"] = run.create_retries
        result["cpu_per_assignment_us"] = per_assignment(result)
        if run.scheduler.alive():
            result["scheduler_rss_mb_end"] = round(rss_mb(scheduler.pid), 1)
    except Exception as exc:  # report what happened, keep the rest of the run's numbers
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"  ERROR {result['error']}", file=sys.stderr)
    finally:
        # Each in its own try: one failing must not leave the scheduler or a worker running.
        for cleanup in (probe.stop, channel.close, workers.stop if workers is not None else None):
            if cleanup is not None:
                try:
                    cleanup()
                except Exception as exc:
                    print(f"  cleanup {cleanup}: {exc!r}", file=sys.stderr)
        result["scheduler_exit"] = scheduler.stop()
        result["scheduler_stderr"] = scheduler.log_summary()
    return result


def per_assignment(result: dict[str, Any]) -> dict[str, float | None]:
    """Scheduler CPU µs per assignment in each round scenario: the rounds' CPU less their
    heartbeats at the steady phase's cost per heartbeat (idle for the empty rounds, busy for the
    busy ones), over the assignments queued. An upper bound: the plans, the broker's
    declarations and the bench's own GetJob/ListDaemons calls are in it too."""
    out: dict[str, float | None] = {}
    for key, steady in (("empty", "idle"), ("busy_rounds", "busy")):
        rounds, window = result.get(key), result.get(steady)
        if not isinstance(rounds, dict) or not isinstance(window, dict):
            continue
        per_hb = window.get("scheduler_cpu_us_per_heartbeat") or 0.0
        assignments = rounds.get("assignments_queued") or 0
        cpu = rounds["scheduler_cpu_s"] - rounds["heartbeats_received"] * per_hb / 1e6
        out[key] = round(cpu / assignments * 1e6, 1) if assignments else None
    return out


def _progress(name: str, value: object) -> None:
    if isinstance(value, dict):
        brief = {k: v for k, v in value.items() if k not in ("rounds", "profile", "heartbeat_lag_ms")}
        print(f"    {json.dumps(brief, default=str)[:600]}", file=sys.stderr)


# -- report ------------------------------------------------------------------------------------------


def environment() -> dict[str, object]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = bool(
        subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=False).stdout
    )
    return {
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "loadavg_at_start": os.getloadavg(),
        "ulimit_nofile": _nofile(),
        "commit": commit + ("-dirty" if dirty else ""),
    }


def _nofile() -> int:
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _median(values: Any) -> float | None:
    numbers = [v for v in values or [] if isinstance(v, int | float)]
    return pct(numbers, 50) if numbers else None


def _f(value: Any, spec: str, width: int) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return f"{'-':>{width}}"
    return f"{value:>{width}{spec}}"


def print_tables(result: dict[str, Any]) -> None:
    runs: list[dict[str, Any]] = result["runs"]
    cpus = result["environment"]["cpus"]
    print(f"\nScheduler and simulator share this machine's {cpus} cores (the simulator's CPU is shown).")
    print("\nsteady state, 1 heartbeat/s per daemon; CPU in cores")
    print("  sched = the scheduler process: loop = its asyncio thread, grpc = gRPC C-core threads")
    print("  probe = a health Check every 100 ms (event-loop stalls show here)")
    print("  machine = busy cores of the whole machine, sirq = of which kernel softirq (network stack)")
    head = f"{'daemons':>8} {'phase':<6}{'sched':>7}{'goal':>6}{'loop':>6}{'grpc':>6}{'sim':>7}{'rabbit':>7}"
    tail = (
        f"{'hb/s':>7}{'rcv/s':>7}{'us/hb':>7}{'load1':>6}"
        f"{'hb lag p99':>11}{'probe p99/max ms':>18}{'RSS MB':>7}{'reconn':>7}"
    )
    print(head + f"{'machine':>8}{'sirq':>6}" + tail)
    for r in runs:
        for phase in ("idle", "busy"):
            w = r.get(phase)
            if not isinstance(w, dict):
                continue
            ok = "ok" if w["scheduler_cores"] <= CPU_GOAL else "OVER"
            threads = w["scheduler_threads_cores"]
            grpc_core = sum(v for k, v in threads.items() if k != "main")
            print(
                f"{r['daemons']:>8} {phase:<6}{w['scheduler_cores']:>7.3f}{ok:>6}"
                f"{threads.get('main', 0.0):>6.2f}"
                f"{grpc_core:>6.2f}{w['simulator_cores']:>7.3f}{w['rabbitmq_cores']:>7.2f}"
                f"{w['machine_cores']['busy']:>8.2f}{w['machine_cores']['softirq']:>6.2f}{w['heartbeats_per_s']:>7.0f}"
                f"{_f(w.get('heartbeats_received_per_s'), '.0f', 7)}"
                f"{_f(w.get('scheduler_cpu_us_per_heartbeat'), '.0f', 7)}{_f(w['loadavg'][0], '.1f', 6)}"
                f"{_f(w['heartbeat_lag_ms']['p99'], '.0f', 8)} ms"
                f"{_f(w['probe_ms']['p99'], '.0f', 11)} /{_f(w['probe_ms']['max'], '.0f', 5)}"
                f"{w['scheduler_rss_mb']:>7.0f}{w['reconnects']:>7}"
            )
    print("\nconnect: all N streams opened at once; until each has Welcome + first Assignment")
    head = f"{'daemons':>8}{'connected':>10}{'all (s)':>9}{'half (s)':>9}"
    print(
        head + f"{'per-daemon p50/p95 ms':>24}{'sched CPU s':>12}{'probe max ms':>14}{'failed streams':>16}"
    )
    for r in runs:
        c = r.get("connect")
        if not isinstance(c, dict):
            continue
        per = c["per_daemon_ms"]
        print(
            f"{r['daemons']:>8}{c['connected']:>10}{_f(c['all_s'], '.2f', 9)}{_f(c['half_s'], '.2f', 9)}"
            f"{_f(per['p50'], '.0f', 14)} /{_f(per['p95'], '.0f', 7)}{c['scheduler_cpu_s']:>12.1f}"
            f"{_f(c['probe_ms']['max'], '.0f', 14)}{sum(c.get('stream_ends', {}).values()):>16}"
        )
    print("\ndisconnect: every stream cancelled at once; until GetClusterInfo counts no daemon")
    print(f"{'daemons':>8}{'all gone (s)':>14}{'sched CPU s':>12}{'probe max ms':>14}")
    for r in runs:
        d = r.get("disconnect")
        if isinstance(d, dict):
            print(
                f"{r['daemons']:>8}{_f(d['all_gone_s'], '.2f', 14)}{d['scheduler_cpu_s']:>12.1f}"
                f"{_f(d['probe_ms']['max'], '.0f', 14)}"
            )
    print(
        "\npropagation: call start -> Assignment at the daemon (ms); 'all' = last affected daemon, per round"
    )
    print(
        "  ret->all = CreateJob's return -> last daemon; declare, plan = CreateJob's split (scheduler log);"
        " pcpu = plan's CPU ms (scheduler log); cpu = scheduler CPU s to the last daemon, own = less the"
        " steady phase's (medians)"
    )
    print(
        f"{'daemons':>8} {'scenario':<13}{'affected/round':>15}{'p50':>8}{'p95':>8}{'max':>8}"
        f"{'all med':>9}{'all max':>9}{'rpc p50':>9}{'ret->all med':>13}{'max':>7}{'declare':>8}{'plan':>6}"
        f"{'pcpu':>6}{'cpu':>6}{'own':>6}"
        f"{'probe max':>10}"
    )
    for r in runs:
        for scenario, key in (("empty", "empty"), ("busy", "busy_rounds")):
            block = r.get(key)
            if not isinstance(block, dict):
                continue
            for event in ("create", "cancel"):
                s = block[event]
                per, alls = s["per_daemon_ms"], s["all_reached_ms"] or {}
                affected = s["daemons_per_round"]
                shown = f"{min(affected)}-{max(affected)}" if affected else "-"
                print(
                    f"{r['daemons']:>8} {scenario + ' ' + event:<13}{shown:>15}{_f(per['p50'], '.0f', 8)}"
                    f"{_f(per['p95'], '.0f', 8)}{_f(per['max'], '.0f', 8)}{_f(alls.get('median'), '.0f', 9)}"
                    f"{_f(alls.get('max'), '.0f', 9)}{_f(s['rpc_ms']['p50'], '.0f', 9)}"
                    f"{_f(_get(s, 'all_after_return_ms', 'median'), '.0f', 13)}"
                    f"{_f(_get(s, 'all_after_return_ms', 'max'), '.0f', 7)}"
                    f"{_f(_median(s.get('declare_ms')), '.0f', 8)}{_f(_median(s.get('plan_ms')), '.0f', 6)}"
                    f"{_f(_median(s.get('plan_cpu_ms')), '.0f', 6)}"
                    f"{_f(_median(s.get('cpu_to_all_s')), '.2f', 6)}"
                    f"{_f(_median(s.get('own_cpu_to_all_s')), '.2f', 6)}"
                    f"{_f(block['probe_ms']['max'], '.0f', 10)}"
                )
    print("\nscheduler CPU per assignment, µs (rounds' CPU less their heartbeats, over assignments queued;")
    print("  plans, declarations and the bench's own calls included: an upper bound)")
    for r in runs:
        per = r.get("cpu_per_assignment_us") or {}
        empty, busy = _f(per.get("empty"), ".0f", 6), _f(per.get("busy_rounds"), ".0f", 6)
        print(f"{r['daemons']:>8}  empty {empty}   busy {busy}")
    if result.get("ratios"):
        print(f"\n{'scaling (largest N / smallest N)':<40}{'value':>8}")
        for name, value in result["ratios"].items():
            print(f"{name:<40}{_f(value, '.2f', 8)}")
    for r in runs:
        problems = [r["error"]] if "error" in r else []
        for key in ("empty", "busy_rounds"):
            for event in ("create", "cancel"):
                problems += _get(r, key, event, "problems") or []
        if _get(r, "connect", "problem"):
            problems.append(r["connect"]["problem"])
        log = r.get("scheduler_stderr", {})
        if problems or log.get("lines"):
            print(f"\n{r['daemons']} daemons: scheduler stderr {log.get('lines', 0)} lines; {problems or ''}")
            for event, count in (log.get("by_event") or {}).items():
                print(f"  {count:>6}  {event}")
        for phase in ("connect", "idle", "empty", "busy", "busy_rounds", "disconnect"):
            profile = _get(r, phase, "profile")
            if profile:
                print(f"\n{r['daemons']} daemons, {phase}: py-spy, {profile['samples']} busy samples")
                print("  own time:")
                for frame, share in profile["own"][:8]:
                    print(f"  {share:>6.1%}  {frame}")
                print("  inclusive:")
                for frame, share in profile["inclusive"][:8]:
                    print(f"  {share:>6.1%}  {frame}")


def ratios(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """How the costs grow from the smallest N to the largest (2.0 = linear in N)."""
    done = [r for r in runs if isinstance(r.get("idle"), dict)]
    if len(done) < 2:
        return {}
    lo, hi = done[0], done[-1]

    def ratio(*path: str) -> float | None:
        a, b = _get(lo, *path), _get(hi, *path)
        return round(b / a, 2) if isinstance(a, int | float) and isinstance(b, int | float) and a else None

    return {
        f"daemons ({hi['daemons']} / {lo['daemons']})": round(hi["daemons"] / lo["daemons"], 2),
        "scheduler cores, idle": ratio("idle", "scheduler_cores"),
        "scheduler cores, busy": ratio("busy", "scheduler_cores"),
        "connect all (s)": ratio("connect", "all_s"),
        "empty create, all reached (median)": ratio("empty", "create", "all_reached_ms", "median"),
        "busy create, all reached (median)": ratio("busy_rounds", "create", "all_reached_ms", "median"),
        "disconnect, all gone (s)": ratio("disconnect", "all_gone_s"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--daemons", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each steady-state window")
    parser.add_argument("--rounds", type=int, default=5, help="job creations (and cancels) per scenario")
    parser.add_argument("--workers", type=int, default=4, help="simulator processes")
    parser.add_argument(
        "--streams-per-channel",
        type=int,
        default=1,
        help="daemon streams per gRPC channel, each channel its own TCP connection (default: 1, one"
        " connection per daemon as in life; 50 multiplexes like a proxy would)",
    )
    parser.add_argument("--connect-timeout", type=float, default=180.0)
    parser.add_argument(
        "--connect-rate",
        type=float,
        default=1000.0,
        help="streams opened per second over all workers (0: all at once; a fleet comes up over"
        " seconds, and 10,000 Hellos in one instant measure a storm, not the steady state)",
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (connect always runs)",
    )
    parser.add_argument(
        "--scheduler-log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the scheduler's --log-level; its stderr is summarised in the report",
    )
    parser.add_argument(
        "--heartbeat-budget",
        type=float,
        default=None,
        help="the scheduler's --heartbeat-budget (heartbeats/s of all daemons; 0: none, every daemon"
        " at 1/s; default: the scheduler's, which stretches the interval above 2,000 daemons)",
    )
    parser.add_argument("--profile", action="store_true", help="sample the scheduler with py-spy")
    parser.add_argument("--json", type=Path, default=Path("bench/results/scheduler_load.json"))
    args = parser.parse_args()
    args.json.parent.mkdir(parents=True, exist_ok=True)

    from truba.local import start_nodes

    base = Path(tempfile.mkdtemp(prefix="truba-bench-sched-"))
    env = environment()
    print(f"temporary files in {base}", file=sys.stderr)
    nodes = start_nodes(base / "rabbit", 1)
    runs = []
    try:
        for n in args.daemons:
            runs.append(run_size(n, args, nodes[0].url, nodes[0].pid, base))
    finally:
        for node in nodes:
            node.stop()
    result: dict[str, Any] = {
        "benchmark": "scheduler_load",
        "environment": env,
        "config": {
            "daemons": args.daemons,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "workers": args.workers,
            "streams_per_channel": args.streams_per_channel,
            "connect_rate": args.connect_rate,
            "phases": args.phases,
            "heartbeat_interval": 1.0,
            "heartbeat_budget": args.heartbeat_budget,
            "slots_per_daemon": "4 and 8, alternating",
            "shared_cores": "scheduler, simulator and RabbitMQ share the machine's cores",
        },
        "goals": {"scheduler_cores": CPU_GOAL},
        "runs": runs,
    }
    result["ratios"] = ratios(runs)
    print_tables(result)
    args.json.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwritten {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
