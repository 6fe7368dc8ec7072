"""The scheduler process: its configuration and the gRPC server that wires the parts together.

:class:`Scheduler` opens the store in the state directory (locked, so one scheduler owns it),
serves ``truba.v1.JobService``, ``truba.v1.DaemonService``, ``truba.v1.ScheduleService`` and the
standard ``grpc.health.v1.Health`` service, resumes the deletion of stale queues, restores the
queues of runnable jobs, watches daemon heartbeats, and fires periodic schedules. It can be
stopped and started again on the same state directory at any moment: jobs and schedules survive,
daemons reconnect and report what they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Final, Protocol, final, runtime_checkable

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]

from truba.pipes.broker import redact
from truba.proto.v1 import (
    daemons_pb2,
    daemons_pb2_grpc,
    jobs_pb2,
    jobs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
)
from truba.scheduler import timeline as task_timeline
from truba.scheduler.assigner import Assigner
from truba.scheduler.auth import TokenAuth
from truba.scheduler.brokers import Brokers
from truba.scheduler.call_metrics import CallCounter
from truba.scheduler.counters import JobCounters
from truba.scheduler.daemons import DaemonServicer
from truba.scheduler.dead_answers import DeadLetterAnswers
from truba.scheduler.dead_letters import DeadLetterReader
from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.events import JobEvents
from truba.scheduler.gc_pause import THAW_EVERY, GcPause
from truba.scheduler.gc_watch import GcWatch
from truba.scheduler.heartbeat_budget import DEFAULT_HEARTBEAT_BUDGET
from truba.scheduler.history import JobHistory
from truba.scheduler.janitor import QueueJanitor
from truba.scheduler.jobs import JobServicer
from truba.scheduler.lease import DEFAULT_TTL, Leadership
from truba.scheduler.lifecycle import DEFAULT_CONSUMER_TIMEOUT, DEFAULT_KEEP_DEAD, JobLifecycle
from truba.scheduler.metrics import SchedulerMetrics
from truba.scheduler.registry import DaemonRegistry
from truba.scheduler.schedule_loop import FiringLoop
from truba.scheduler.schedule_pipes import BrokerSchedulePipes
from truba.scheduler.schedule_service import ScheduleServicer
from truba.scheduler.schedules import ScheduleBook, schedule_progress
from truba.scheduler.standby import LeaderGate
from truba.scheduler.store import JobStore
from truba.scheduler.store_open import POSTGRESQL_SCHEMES, last_known, open_store
from truba.scheduler.view import ClusterView
from truba.scheduler.wiring import open_admin, pipe_brokers

if TYPE_CHECKING:  # aiohttp costs every `truba` command half a second at import: load it when serving
    from truba.http_server import HttpServer

log = logging.getLogger(__name__)

DEFAULT_LISTEN: Final = "127.0.0.1:50051"
"""Loopback by default: exposing the API is an explicit choice (then with ``token`` and TLS)."""
PENDING_CALLS: Final = (
    ("grpc.server.max_pending_requests", 50_000),
    ("grpc.server.max_pending_requests_hard_limit", 100_000),
)
"""How many new calls gRPC's core holds until the asyncio server takes them (one at a time, as
its loop gets to it). Its defaults (1,000, then refusing at random up to 3,000) failed thousands
of daemons' Connects when a fleet came up or reconnected at once (after a restart or a failover):
each was tried again, which made the storm longer. A held call costs a few kB until it is taken."""
COUNTERS_FLUSH: Final = 2.0
SLOW_FLUSH: Final = 0.1
"""Seconds a counters flush may take before it is logged (it runs on the event loop)."""
"""Seconds between writes of changed task counters to the store."""
STORE_FILE: Final = "scheduler.sqlite3"
LOCK_FILE: Final = "scheduler.lock"
SERVICES: Final = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    daemons_pb2.DESCRIPTOR.services_by_name["DaemonService"].full_name,
    schedules_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name,
)


@runtime_checkable
class _Fenced(Protocol):
    def fence_writes(self, holder: str, epoch: int) -> None: ...


@dataclass(frozen=True)
class SchedulerConfig:
    """How to run a scheduler.

    Attributes:
        brokers: AMQP URLs of the data-plane brokers, at least one; named b0, b1, ... in order.
        state_dir: directory of the SQLite store (created if missing; locked even when ``store``
            names another database).
        store: where jobs are kept: None for SQLite in ``state_dir``, or a ``postgresql://`` URL
            (:mod:`truba.scheduler.store_postgres`).
        store_timeout: seconds; bound on connecting to the ``store`` database and on each
            statement (the scheduler's loop waits for it).
        listen: ``HOST:PORT`` to serve on; port 0 picks a free port (see :attr:`Scheduler.port`).
        heartbeat_interval: seconds between daemon heartbeats; 3 missed ones drop the daemon.
        heartbeat_budget: heartbeats per second all daemons together send at most: with more than
            ``budget * heartbeat_interval`` daemons each is told a longer interval, a multiple of
            ``heartbeat_interval`` (:func:`~truba.scheduler.heartbeat_budget.interval_for`); 0: no limit.
        broker_timeout: bound on connecting to a broker and on each queue operation, seconds.
        delete_wait: how long FinishJob/CancelJob wait for queue deletion before answering.
        consumer_timeout: the brokers' delivery-ack timeout, seconds (rabbitmq.conf
            ``consumer_timeout``); jobs with a longer task timeout are refused.
        keep_dead: seconds an ended job's dead-letter queue is kept (0: deleted with the others).
        token: when set, every call but health checks must carry ``authorization: Bearer <token>``.
        tls_cert, tls_key: PEM files; when both are set the scheduler serves TLS only.
        http: ``HOST:PORT`` for metrics and the JSON API (:mod:`truba.scheduler.http_api`);
            port 0 picks a free port; None serves no HTTP.
        advertise: ``HOST:PORT`` where clients and daemons reach this scheduler, named by the
            standbys when it leads (default: ``listen``); high availability only.
        lease_ttl: seconds the leader's lease lasts after each renew (high availability: the
            ``store`` is PostgreSQL and several schedulers share it; see
            :mod:`truba.scheduler.ha`).
    """

    brokers: Sequence[str]
    state_dir: Path
    listen: str = DEFAULT_LISTEN
    heartbeat_interval: float = 2.0
    heartbeat_budget: float = DEFAULT_HEARTBEAT_BUDGET
    broker_timeout: float = 10.0
    delete_wait: float = 5.0
    grpc_options: Sequence[tuple[str, int | str]] = field(default=())
    consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT
    keep_dead: float = DEFAULT_KEEP_DEAD
    token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    http: str | None = None
    store: str | None = None
    store_timeout: float = 5.0
    advertise: str | None = None
    lease_ttl: float = DEFAULT_TTL

    def __post_init__(self) -> None:
        object.__setattr__(self, "brokers", tuple(self.brokers))
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        if not self.brokers:
            raise ValueError("brokers: at least one AMQP URL is required")
        if not self.heartbeat_interval > 0:
            raise ValueError(f"heartbeat_interval: must be > 0, got {self.heartbeat_interval}")
        if not self.heartbeat_budget >= 0:
            raise ValueError(f"heartbeat_budget: must be >= 0, got {self.heartbeat_budget}")
        if not self.broker_timeout > 0:
            raise ValueError(f"broker_timeout: must be > 0, got {self.broker_timeout}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key: give both or neither")
        if self.token is not None and not self.token:
            raise ValueError("token: must not be empty")
        if not self.consumer_timeout > 0:
            raise ValueError(f"consumer_timeout: must be > 0, got {self.consumer_timeout}")
        if not self.keep_dead >= 0:
            raise ValueError(f"keep_dead: must be >= 0, got {self.keep_dead}")
        if self.store is not None and not self.store.startswith(POSTGRESQL_SCHEMES):
            raise ValueError(f"store: must be a postgresql:// URL, got {self.store.split(':', 1)[0]!r}")
        if not self.store_timeout > 0:
            raise ValueError(f"store_timeout: must be > 0, got {self.store_timeout}")
        if not self.lease_ttl > 1.0:
            raise ValueError(f"lease_ttl: must be > 1 second, got {self.lease_ttl}")
        for name, address in (("listen", self.listen), ("http", self.http), ("advertise", self.advertise)):
            if address is None:
                continue
            host, colon, port = address.rpartition(":")
            if not (host and colon and port.isdigit()):
                raise ValueError(f"{name}: must look like HOST:PORT, got {address!r}")


@final
class Scheduler:
    """The scheduler server: ``await start()``, then ``await stop()`` (or ``async with``).

    Raises (from start):
        RuntimeError: the listen address cannot be bound, or another scheduler holds the state
            directory.
        StoreUnavailable: the ``store`` database cannot be reached (or psycopg is missing).
        StoreTooNew: the store was written by a newer truba.
    """

    def __init__(self, config: SchedulerConfig, *, leadership: Leadership | None = None) -> None:
        """``leadership``: given by the election when several schedulers share the store
        (:mod:`truba.scheduler.ha`); without it this scheduler is the only one, and takes the
        next epoch from the store at start."""
        self.config = config
        self._leadership = leadership
        self.epoch = 0
        """The leader epoch this scheduler stamps on Welcomes and Assignments (after start)."""
        self._port: int | None = None
        self._stack = contextlib.AsyncExitStack()
        self._registry = DaemonRegistry()
        self._health = health_aio.HealthServicer()
        self._grace: float | None = 5.0
        self._started = False
        self._http: HttpServer | None = None
        self.metrics = SchedulerMetrics()

    @property
    def port(self) -> int:
        """The port being served (the real one when ``listen`` asked for port 0)."""
        if self._port is None:
            raise RuntimeError("the scheduler is not started")
        return self._port

    @property
    def address(self) -> str:
        """``HOST:PORT`` being served, for clients and daemons."""
        return f"{self.config.listen.rpartition(':')[0]}:{self.port}"

    @property
    def http_address(self) -> str | None:
        """``HOST:PORT`` of the HTTP face (metrics, JSON API), or None when it is off."""
        return self._http.address if self._http is not None else None

    async def start(self) -> None:
        """Binds, starts serving and returns; stops what it opened if that fails."""
        if self._started:
            raise RuntimeError("a Scheduler starts once; make a new one to start again")
        self._started = True
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise

    async def _start(self) -> None:
        config = self.config
        stack = self._stack
        gc_watch = GcWatch()
        gc_watch.install()
        stack.callback(gc_watch.remove)
        gc_pause = GcPause()
        stack.callback(gc.unfreeze)  # what this scheduler froze is collected as usual again
        config.state_dir.mkdir(parents=True, exist_ok=True)
        stack.enter_context(_exclusive(config.state_dir / LOCK_FILE))
        store, where = open_store(config.store, config.state_dir / STORE_FILE, timeout=config.store_timeout)
        stack.callback(store.close)
        lead = self._leadership
        self.epoch = lead.epoch if lead is not None else store.claim_epoch(config.advertise or config.listen)
        if lead is not None and lead.holder and isinstance(store, _Fenced):
            store.fence_writes(lead.holder, lead.epoch)  # no write lands once another leads
        brokers = Brokers(config.brokers, connect=open_admin, timeout=config.broker_timeout)
        stack.push_async_callback(brokers.close)
        janitor = QueueJanitor(brokers, store)
        stack.push_async_callback(janitor.close)
        counters = JobCounters()
        counters.restore(store.load_counters())
        events = JobEvents()
        stack.callback(events.close)
        assigner = Assigner(
            self._registry,
            last_known(store.list),
            heartbeat_interval=config.heartbeat_interval,
            heartbeat_budget=config.heartbeat_budget,
            counters=counters,
            events=events,
            observer=self.metrics,
            gc_pause=gc_pause,
        )
        lifecycle = JobLifecycle(
            store,
            brokers,
            janitor,
            assigner,
            events=events,
            counters=counters,
            delete_wait=config.delete_wait,
            consumer_timeout=config.consumer_timeout,
            keep_dead=config.keep_dead,
        )

        # gRPC sets SO_REUSEPORT by default: a second scheduler on the same port would silently
        # share its traffic instead of failing to bind.
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), *PENDING_CALLS, *config.grpc_options],
            interceptors=[
                CallCounter(self.metrics.grpc_calls),
                *([LeaderGate(lead.leading, lead.leader)] if lead is not None else []),
                *([TokenAuth(config.token)] if config.token else []),
            ],
        )
        timeline = task_timeline.TaskTimeline()
        dead_letters = DeadLetterReader(brokers, store)
        jobs_pb2_grpc.add_JobServiceServicer_to_server(
            JobServicer(lifecycle, assigner, brokers.infos, dead_letters, timeline), server
        )
        daemons_pb2_grpc.add_DaemonServiceServicer_to_server(
            DaemonServicer(
                assigner,
                brokers.infos,
                timeline=timeline,
                epoch=self.epoch,
                leading=lead.leading if lead is not None else None,
            ),
            server,
        )
        pipes = BrokerSchedulePipes(
            config.brokers, pipe_brokers("truba-scheduler", heartbeat=10.0, timeout=config.broker_timeout)
        )
        firing = FiringLoop(
            store.schedules, pipes, observer=self.metrics, progress=schedule_progress(lifecycle)
        )
        stack.push_async_callback(firing.close)
        book = ScheduleBook(store.schedules, lifecycle, firing, consumer_timeout=config.consumer_timeout)
        schedules_pb2_grpc.add_ScheduleServiceServicer_to_server(ScheduleServicer(book), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if config.tls_cert is not None and config.tls_key is not None:
            tls = grpc.ssl_server_credentials([(config.tls_key.read_bytes(), config.tls_cert.read_bytes())])
            port = server.add_secure_port(config.listen, tls)
        else:
            port = server.add_insecure_port(config.listen)
        await server.start()
        stack.push_async_callback(self._stop_server, server)

        view = ClusterView(lifecycle, assigner)
        self.metrics.watch(view)
        if config.http is not None:
            history = JobHistory(view)
            _background(history.run(), stack, name="job-history")
            from truba.http_server import HttpServer
            from truba.scheduler.http_api import build_app

            dead = DeadLetterAnswers(lifecycle.get, dead_letters)
            http = HttpServer(
                build_app(
                    view,
                    self.metrics,
                    history,
                    token=config.token,
                    timeline=timeline,
                    schedules=book,
                    dead=dead,
                ),
                config.http,
                started="sched.http.started",
            )
            await http.start()
            stack.push_async_callback(http.close)
            self._http = http

        for service in ("", *SERVICES):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        runnable = store.list()
        janitor.resume()
        janitor.restore(job.queues for job in runnable)
        _background(assigner.watch(), stack, name="heartbeat-watchdog")
        _background(_thaw(gc_pause), stack, name="gc-thaw")
        schedules = book.restore()
        _background(firing.run(), stack, name="schedules")
        _background(janitor.watch_dead(), stack, name="dead-letters-expiry")
        _background(
            _flush_counters(counters, store, lambda: assigner.interval_for(assigner.daemon_count), gc_pause),
            stack,
            name="counters-flush",
        )
        stack.callback(_store_counters, counters, store)
        self._port = port
        log.info(
            "sched.started",
            extra={
                "listen": self.address,
                "http": self.http_address,
                "brokers": [redact(url) for url in config.brokers],
                "state_dir": str(config.state_dir),
                "store": where,
                "epoch": self.epoch,
                "jobs": len(runnable),
                "schedules": schedules,
                "stale_queues": len(janitor.pending()),
            },
        )

    async def _stop_server(self, server: grpc.aio.Server) -> None:
        await self._health.enter_graceful_shutdown()
        # Daemon streams live forever: end them now rather than after the grace period.
        for session in self._registry:
            session.close(grpc.StatusCode.UNAVAILABLE, "the scheduler is shutting down")
        await server.stop(self._grace)

    async def stop(self, grace: float | None = 5.0) -> None:
        """Stops serving (in-flight calls get ``grace`` seconds), then closes everything. Idempotent."""
        self._grace = grace
        await self._stack.aclose()
        if self._port is not None:
            log.info("sched.stopped", extra={"listen": self.address})
            self._port = None

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def _flush_counters(
    counters: JobCounters, store: JobStore, interval: Callable[[], float], gc_pause: GcPause | None = None
) -> None:
    """Writes changed counters every :data:`COUNTERS_FLUSH` seconds, or every heartbeat
    ``interval()`` the daemons are told when that is longer (one transaction each time).

    Counters change with heartbeats, so on a cluster past the heartbeat budget a shorter period
    would store little more; and each write encodes a changed job's per-daemon counts (about
    20 ms of CPU per job at 10,000 daemons, on the loop)."""
    while True:
        await asyncio.sleep(max(COUNTERS_FLUSH, interval()))
        _store_counters(counters, store, gc_pause)


async def _thaw(gc_pause: GcPause) -> None:
    """Collects the objects the plans froze every :data:`~truba.scheduler.gc_pause.THAW_EVERY`
    seconds (their reference cycles are garbage nothing else reclaims)."""
    while True:
        await asyncio.sleep(THAW_EVERY)
        gc_pause.thaw()


def _store_counters(counters: JobCounters, store: JobStore, gc_pause: GcPause | None = None) -> None:
    """Stores the changed counters. Encoding them makes a list per job and daemon (at 10,000
    daemons): with ``gc_pause`` no collection runs inside (:mod:`~truba.scheduler.gc_pause`)."""
    began = time.perf_counter()
    if gc_pause is None:
        dirty = counters.dirty()
    else:
        with gc_pause:
            dirty = counters.dirty()
    if dirty:
        encoded = time.perf_counter()
        try:
            store.save_counters(dirty)
        except StoreUnavailable as exc:  # still dirty: the next flush writes them
            log.warning("sched.counters.store_failed", extra={"error": str(exc), "jobs": len(dirty)})
            return
        counters.stored(dirty)
        took = time.perf_counter() - began
        if took >= SLOW_FLUSH:  # on the loop: every heartbeat and push waits behind it
            log.info(
                "sched.counters.slow_flush",
                extra={
                    "jobs": len(dirty),
                    "bytes": sum(len(text) for text in dirty.values()),
                    "encode_ms": round((encoded - began) * 1000, 1),
                    "write_ms": round((time.perf_counter() - encoded) * 1000, 1),
                },
            )


def _background(
    coroutine: Coroutine[None, None, None], stack: contextlib.AsyncExitStack, *, name: str
) -> asyncio.Task[None]:
    """Runs ``coroutine`` as a task that ``stack`` cancels and awaits when it closes."""
    task = asyncio.create_task(coroutine, name=name)

    async def cancel() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(cancel)
    return task


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[IO[str]]:
    """Holds an exclusive lock on ``path`` (with our pid in it) for the block."""
    handle = path.open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "?"
            raise RuntimeError(f"{path.parent} is in use by another scheduler (pid {owner})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield handle
    finally:
        handle.close()  # closing releases the lock
