"""High availability: a scheduler on PostgreSQL leads while it holds the lease, or stands by.

``truba scheduler --store postgresql://…`` runs this. Several such schedulers on one database
elect one leader through the lease (:mod:`~truba.scheduler.lease`,
:mod:`~truba.scheduler.election`); a lone one leads at once.

- **Standby.** It serves its ``--listen`` and ``--http`` addresses with a
  :class:`~truba.scheduler.standby.StandbyFace` (every call ``UNAVAILABLE`` naming the leader)
  and tries to take the lease every 0.5 s. It holds no state: nothing of the store is read.
- **Taking over.** Once it holds the lease, it closes the face and starts a
  :class:`~truba.scheduler.server.Scheduler` on the same addresses, which loads everything from
  the store exactly as a restarted scheduler does (jobs, counters, schedules, the janitor's
  ledger). Its epoch goes into every Welcome and Assignment; daemons ignore older ones.
- **Leading.** It renews every third of the ttl; the fence stops it leading before the lease
  can end in the database (calls refused, daemon streams ended), and a watchdog thread steps
  it down even while the event loop is blocked.
- **Stepping down** is a re-exec of the process (``os.execve`` of its own command line): the
  fresh process is a standby with no state left over, on the same addresses (passed on in
  ``$TRUBA_SCHEDULER_LISTEN`` and ``$TRUBA_SCHEDULER_HTTP``, so a port 0 stays the port it got).
- **SIGINT/SIGTERM** stops serving, then releases the lease: a standby leads within its poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Final, NoReturn, TypeVar

from truba.scheduler.election import Elector
from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.lease import Leadership
from truba.scheduler.server import SERVICES, Scheduler, SchedulerConfig
from truba.scheduler.standby import StandbyFace
from truba.scheduler.store_open import open_store

log = logging.getLogger(__name__)
T = TypeVar("T")

LISTEN_ENV: Final = "TRUBA_SCHEDULER_LISTEN"
"""Set on a re-exec: the gRPC address the process served (it serves it again)."""
HTTP_ENV: Final = "TRUBA_SCHEDULER_HTTP"
"""Set on a re-exec: the HTTP address the process served (``off``: none)."""
LEADING_LINE: Final = "truba scheduler leading on "
"""Printed (with the address and epoch) once this scheduler leads."""

_stepping = threading.Lock()


def step_down(listen: str, http: str | None, reason: str) -> NoReturn:
    """Re-executes this process as a fresh standby on the same addresses; never returns."""
    _stepping.acquire()  # the watchdog and the loop may both get here: the first one execs
    log.warning("sched.stepping_down", extra={"reason": reason, "listen": listen})
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    env = dict(os.environ, **{LISTEN_ENV: listen, HTTP_ENV: http or "off"})
    os.execve(sys.executable, sys.orig_argv, env)


async def serve(
    config: SchedulerConfig, stop: asyncio.Event, say: Callable[[str], None], *, stepped_down: bool = False
) -> int:
    """Leads or stands by until ``stop`` is set; returns the exit code (steps down by re-exec).

    ``stepped_down``: this process is the re-exec of a leader that stepped down; a store it
    cannot reach is tried again every second (the cause of the step-down may be a partition)
    instead of ending the command.

    Raises:
        StoreUnavailable, StoreTooNew: the store cannot be used.
        RuntimeError, SchedulerError: as :meth:`Scheduler.start` (the first start only).
    """
    from truba.scheduler.lease_postgres import PostgresLease

    assert config.store is not None
    # Reach the database and apply the schema steps (the lease's table among them) first: a
    # store unreachable at start ends the command with one line, as for a lone scheduler.
    while True:
        try:
            store, _ = open_store(config.store, config.state_dir, timeout=config.store_timeout)
            break
        except StoreUnavailable as exc:
            if not stepped_down:
                raise
            log.warning("sched.store.unreachable", extra={"error": str(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if stop.is_set():
                return 0
    store.close()
    lease = PostgresLease(config.store, timeout=config.lease_ttl / 3)
    elector = Elector(lease, address=config.advertise or config.listen, ttl=config.lease_ttl)
    try:
        return await _serve(config, elector, stop, say)
    finally:
        lease.close()


async def _serve(
    config: SchedulerConfig, elector: Elector, stop: asyncio.Event, say: Callable[[str], None]
) -> int:
    listen, http = config.listen, config.http
    announced = False
    epoch = await elector.try_once()
    if epoch == 0:  # another leads (or the database did not answer): stand by
        face = StandbyFace(
            listen,
            http,
            leader=elector.leader_address,
            services=SERVICES,
            grpc_options=config.grpc_options,
            tls=_tls(config),
        )
        await face.start()
        listen, http = face.address, face.http_address
        if config.advertise is None:
            elector.address = listen
        _announce(say, listen, http)
        announced = True
        log.info("sched.standby", extra={"listen": listen, "leader": elector.leader_address()})
        try:
            won = await _until(elector.campaign(), stop)
        finally:
            await face.stop()
        if won is None:
            return 0
        epoch = won
    scheduler = Scheduler(
        dataclasses.replace(config, listen=listen, http=http),
        leadership=Leadership(epoch, elector.fence.leading, elector.leader_address, elector.holder),
    )
    watchdog = elector.watchdog(lambda: step_down(listen, http, "lease deadline passed"))
    holding = asyncio.ensure_future(elector.hold())  # renews from now on, while the state loads
    try:
        await scheduler.start()
    except Exception as exc:
        if not announced:  # the first start: fail as a lone scheduler does
            watchdog.set()
            holding.cancel()
            elector.lose("could not start")
            await asyncio.to_thread(elector.release)
            raise
        step_down(listen, http, f"could not start leading: {exc}")
    listen, http = scheduler.address, scheduler.http_address
    if config.advertise is None:
        elector.address = listen  # the next renew tells the standbys the real port
    if not announced:
        _announce(say, listen, http)
    say(f"{LEADING_LINE}{elector.address} (epoch {epoch})")
    await _until(holding, stop)
    if not stop.is_set():
        step_down(listen, http, "lease lost")
    watchdog.set()
    elector.lose("stopping")
    await scheduler.stop(STOP_GRACE)
    await asyncio.to_thread(elector.release)
    return 0


STOP_GRACE: Final = 5.0
"""Seconds in-flight calls get on SIGINT/SIGTERM (as a lone scheduler's)."""


def _announce(say: Callable[[str], None], listen: str, http: str | None) -> None:
    say(f"truba scheduler listening on {listen}")
    if http is not None:
        say(f"truba scheduler http on http://{http}/")


async def _until(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """Awaits ``work`` until it ends (its result) or ``stop`` is set (None; ``work`` cancelled)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def _tls(config: SchedulerConfig) -> tuple[bytes, bytes] | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    return config.tls_key.read_bytes(), config.tls_cert.read_bytes()
