"""``truba scheduler``: run the scheduler until SIGINT or SIGTERM.

Once serving it prints one line to stdout, ``truba scheduler listening on HOST:PORT``, so that
wrappers (``truba up``, tests, init scripts) can wait for it, then ``truba scheduler http on
http://HOST:PORT/`` when HTTP is on; logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path

from truba import logs
from truba.channel import TOKEN_ENV
from truba.scheduler import ha
from truba.scheduler.errors import SchedulerError
from truba.scheduler.heartbeat_budget import DEFAULT_HEARTBEAT_BUDGET
from truba.scheduler.lease import DEFAULT_TTL
from truba.scheduler.lifecycle import DEFAULT_CONSUMER_TIMEOUT, DEFAULT_KEEP_DEAD
from truba.scheduler.server import DEFAULT_LISTEN, Scheduler, SchedulerConfig

log = logging.getLogger(__name__)

STOP_GRACE = 5.0
"""Seconds in-flight calls get to finish on SIGINT/SIGTERM."""


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/truba/scheduler``, or ``~/.local/state/truba/scheduler``."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "truba" / "scheduler"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``scheduler`` subcommand; its ``func`` runs the scheduler and returns an exit code."""
    parser = subparsers.add_parser(
        "scheduler",
        help="run the scheduler",
        description="Run the truba scheduler: jobs, daemons and their assignments, over gRPC.",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on; port 0 picks a free one (default: {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--http",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus /metrics and the JSON API here; 'off' serves none (default: the"
        " --listen host, its port + 1, e.g. 127.0.0.1:50052; a free port when --listen's is 0)",
    )
    parser.add_argument(
        "--broker",
        dest="brokers",
        action="append",
        required=True,
        metavar="AMQP_URL",
        help="a data-plane RabbitMQ broker, e.g. amqp://guest:guest@127.0.0.1:5672/; repeatable",
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory of the job store (default: $XDG_STATE_HOME/truba/scheduler)",
    )
    parser.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="keep jobs in this PostgreSQL database, e.g. postgresql://truba@db.example:5432/truba"
        " (a password goes in ~/.pgpass or $PGPASSWORD, not on argv); default: SQLite in --state",
    )
    parser.add_argument(
        "--store-timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="bound on connecting to the --store database and on each statement (default: 5)",
    )
    parser.add_argument(
        "--advertise",
        default=None,
        metavar="HOST:PORT",
        help="with a PostgreSQL --store (high availability): where clients and daemons reach this"
        " scheduler, named by the standbys while it leads (default: the --listen address)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=DEFAULT_TTL,
        metavar="S",
        help="with a PostgreSQL --store: seconds the leader's lease lasts after each renew; a standby"
        f" leads about this long after the leader dies (default: {DEFAULT_TTL:g})",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between daemon heartbeats; 3 missed ones drop a daemon (default: 2)",
    )
    parser.add_argument(
        "--heartbeat-budget",
        type=float,
        default=DEFAULT_HEARTBEAT_BUDGET,
        metavar="PER_SECOND",
        help="heartbeats per second all daemons together send at most: a larger cluster is told a"
        f" longer interval (default: {DEFAULT_HEARTBEAT_BUDGET:g}; 0: no limit)",
    )
    parser.add_argument(
        "--consumer-timeout",
        type=float,
        default=DEFAULT_CONSUMER_TIMEOUT,
        metavar="S",
        help="the brokers' consumer_timeout in seconds; jobs with a longer task timeout are refused"
        f" (default: {DEFAULT_CONSUMER_TIMEOUT:g}, RabbitMQ's)",
    )
    parser.add_argument(
        "--keep-dead",
        type=float,
        default=DEFAULT_KEEP_DEAD,
        metavar="S",
        help="seconds a job's dead letters (given-up and poison tasks) are kept after it ends;"
        f" 0 deletes them with its other queues (default: {DEFAULT_KEEP_DEAD:g}, 7 days)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"require this bearer token (first line of FILE) on every call; default: ${TOKEN_ENV} if set",
    )
    parser.add_argument(
        "--tls-cert", type=Path, default=None, metavar="PEM", help="serve TLS with this certificate"
    )
    parser.add_argument(
        "--tls-key", type=Path, default=None, metavar="PEM", help="the certificate's private key"
    )
    logs.add_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Runs the scheduler described by ``args`` until SIGINT/SIGTERM; returns the exit code."""
    logs.setup(args.log_level, args.log_format)
    # A scheduler that stepped down re-executes itself on the addresses it served (scheduler.ha).
    stepped_down = ha.LISTEN_ENV in os.environ
    listen = os.environ.pop(ha.LISTEN_ENV, None) or args.listen
    http = os.environ.pop(ha.HTTP_ENV, None) or args.http
    try:
        config = SchedulerConfig(
            brokers=args.brokers,
            state_dir=args.state or default_state_dir(),
            listen=listen,
            heartbeat_interval=args.heartbeat_interval,
            heartbeat_budget=args.heartbeat_budget,
            consumer_timeout=args.consumer_timeout,
            keep_dead=args.keep_dead,
            token=_token(args.token_file),
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            http=http_address(http, listen),
            store=args.store,
            store_timeout=args.store_timeout,
            advertise=args.advertise,
            lease_ttl=args.lease_ttl,
        )
    except (ValueError, OSError) as exc:
        log.error("sched.bad_args", extra={"error": str(exc)})
        print(f"truba scheduler: {exc}", file=sys.stderr)
        return 2
    if config.store is not None:
        return asyncio.run(_then_let_calls_end(_serve_ha(config, stepped_down=stepped_down)))
    return asyncio.run(_then_let_calls_end(_serve(config)))


def http_address(given: str | None, listen: str) -> str | None:
    """``--http`` as given (``off``: None), else the listen host with its port + 1 (0 stays 0)."""
    if given is not None:
        return None if given == "off" else given
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        return None  # SchedulerConfig says what is wrong with --listen
    return f"{host}:{int(port) + 1 if int(port) else 0}"


def _token(path: Path | None) -> str | None:
    """The token from ``path`` (first line), else ``$TRUBA_TOKEN``; a token never goes on argv,
    where every user of the machine could read it."""
    if path is not None:
        lines = path.read_text().splitlines()
        if not lines or not lines[0].strip():
            raise ValueError(f"--token-file {path}: the first line must hold the token")
        return lines[0].strip()
    return os.environ.get(TOKEN_ENV) or None


CALLS_END_WAIT = 2.0
"""Seconds the stopped scheduler waits for what still runs on its loop before asyncio.run cancels it."""


async def _then_let_calls_end(serve: Coroutine[None, None, int]) -> int:
    """Runs ``serve``, then waits (at most :data:`CALLS_END_WAIT`) for the tasks still on the loop.

    Those are gRPC's tasks of the calls the stop just ended (a daemon's stream aborted with
    UNAVAILABLE may still be sending its status). asyncio.run would cancel them, and gRPC logs
    each cancelled call as an unhandled error with a traceback on stderr, on an orderly stop.
    """
    code = await serve
    current = asyncio.current_task()
    running = [task for task in asyncio.all_tasks() if task is not current]
    if running:
        _, left = await asyncio.wait(running, timeout=CALLS_END_WAIT)
        log.debug("sched.stop.tasks", extra={"running": len(running), "left": [t.get_name() for t in left]})
    return code


async def _serve(config: SchedulerConfig) -> int:
    scheduler = Scheduler(config)
    try:
        await scheduler.start()
    except (RuntimeError, SchedulerError) as exc:  # cannot bind, state directory in use, store down
        log.error("sched.start_failed", extra={"error": str(exc)})
        print(f"truba scheduler: {exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        print(f"truba scheduler listening on {scheduler.address}", flush=True)
        if scheduler.http_address is not None:
            print(f"truba scheduler http on http://{scheduler.http_address}/", flush=True)
        await stop.wait()
        log.info("sched.stopping", extra={"grace": STOP_GRACE})
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await scheduler.stop(STOP_GRACE)
    return 0


async def _serve_ha(config: SchedulerConfig, *, stepped_down: bool) -> int:
    """A scheduler on PostgreSQL: leads, or stands by until it may (:mod:`truba.scheduler.ha`)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        return await ha.serve(config, stop, lambda line: print(line, flush=True), stepped_down=stepped_down)
    except (RuntimeError, SchedulerError) as exc:  # cannot bind, state directory in use, store down
        log.error("sched.start_failed", extra={"error": str(exc)})
        print(f"truba scheduler: {exc}", file=sys.stderr)
        return 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
