"""``truba daemon``: run a compute daemon on this node.

Signals: the first SIGTERM or SIGINT drains (running tasks finish, their results are confirmed,
nothing new is taken, then exit 0); a second one stops at once (running tasks go back to their
queues, unspent; exit 0). ``--drain-timeout`` bounds a drain the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
from typing import Final

from truba import logs
from truba.channel import default_scheduler
from truba.daemon.daemon import PREFETCH_EXTRA, Daemon, DaemonConfig
from truba.daemon.metrics_http import metrics_listen, metrics_server
from truba.daemon.sizing import default_slots
from truba.daemon.terms import SlotPolicy

log = logging.getLogger(__name__)
PID_ONE_ADVICE: Final = (
    "running as PID 1: processes that handlers start and leave behind are not reaped and stay "
    "zombies; run the daemon under an init (docker run --init, compose init: true)"
)
MIB = 1024 * 1024


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``daemon`` subcommand."""
    parser = subparsers.add_parser(
        "daemon",
        help="run a compute daemon on this node",
        description="Run a compute daemon: it connects to the scheduler, runs slot processes and lends "
        "them to the jobs it is assigned. SIGTERM drains it (running tasks finish); a second one stops it.",
    )
    add_arguments(parser)
    parser.set_defaults(func=main)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The daemon's flags (shared by ``truba daemon`` and ``python -m truba.daemon``)."""
    parser.add_argument(
        "--scheduler",
        default=default_scheduler(),
        metavar="HOST[:PORT][,...]",
        help="the scheduler's address, or several comma-separated (high availability: the leader is"
        " followed); default: $TRUBA_SCHEDULER, else 127.0.0.1:50051; port 50051 if none",
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=None,
        metavar="N",
        help="slot processes (default: min(usable CPUs, available memory / per-slot memory), "
        "per-slot memory being the hard limit, else the soft limit, else 512 MiB)",
    )
    parser.add_argument(
        "--allow",
        action="append",
        required=True,
        metavar="PATTERN",
        help="fnmatch pattern of handlers ('package.module:function') this daemon may import; repeatable",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="run jobs created with codec='pickle' (unpickling a payload runs code of its sender's"
        " choosing: allow it only where everyone who can create jobs may run code here); without"
        " it, each task of such a job gets a PickleRefused error",
    )
    parser.add_argument("--id", dest="daemon_id", default=None, help="daemon id (default: host-pid)")
    parser.add_argument(
        "--max-tasks-per-slot",
        type=int,
        default=0,
        metavar="N",
        help="replace a slot's process after N tasks (default 0: never)",
    )
    parser.add_argument(
        "--slot-memory-soft",
        type=float,
        default=0,
        metavar="MIB",
        help="replace a slot's process after a task when its private memory (USS) exceeds this",
    )
    parser.add_argument(
        "--slot-memory-hard",
        type=float,
        default=0,
        metavar="MIB",
        help="kill a slot during a task when its private memory exceeds this (the attempt is spent)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="on SIGTERM, interrupt tasks still running after this long (default: let them finish)",
    )
    parser.add_argument(
        "--prefetch-extra",
        type=int,
        default=PREFETCH_EXTRA,
        metavar="N",
        help=f"deliveries a job may hold per broker beyond its slots (default {PREFETCH_EXTRA})",
    )
    parser.add_argument(
        "--no-fork-server",
        dest="fork_server",
        action="store_false",
        help="spawn a fresh interpreter per slot instead of forking slots from a template process "
        "that preloaded the assigned handlers' modules",
    )
    parser.add_argument(
        "--broker-heartbeat", type=float, default=10.0, metavar="SECONDS", help="AMQP heartbeat"
    )
    parser.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off; a PORT alone"
        " listens on 127.0.0.1)",
    )
    logs.add_arguments(parser)


def config_from(args: argparse.Namespace) -> DaemonConfig | str:
    """The daemon's config from parsed flags, or an error message."""
    if args.slots is not None and args.slots < 1:
        return "--slots must be >= 1"
    if args.max_tasks_per_slot < 0 or args.slot_memory_soft < 0 or args.slot_memory_hard < 0:
        return "--max-tasks-per-slot and --slot-memory-* must be >= 0"
    if args.slot_memory_soft and args.slot_memory_hard and args.slot_memory_soft > args.slot_memory_hard:
        return "--slot-memory-soft must not exceed --slot-memory-hard"
    if args.prefetch_extra < 0:
        return "--prefetch-extra must be >= 0"
    policy = SlotPolicy(
        max_tasks=args.max_tasks_per_slot or None,
        memory_soft=int(args.slot_memory_soft * MIB) or None,
        memory_hard=int(args.slot_memory_hard * MIB) or None,
        allow_pickle=args.allow_pickle,
    )
    slots = args.slots or default_slots(policy.memory_hard or policy.memory_soft)
    config = DaemonConfig(
        args.scheduler,
        slots,
        list(args.allow),
        broker_heartbeat=args.broker_heartbeat,
        policy=policy,
        prefetch_extra=args.prefetch_extra,
        drain_timeout=args.drain_timeout,
        fork_server=args.fork_server,
    )
    if args.daemon_id:
        config.daemon_id = args.daemon_id
    return config


def main(args: argparse.Namespace) -> int:
    logs.setup(args.log_level, args.log_format)
    config = config_from(args)
    if isinstance(config, str):
        log.error("daemon.bad_args", extra={"error": config})
        return 2
    if args.metrics is not None:
        try:
            metrics_listen(args.metrics)
        except ValueError as exc:
            log.error("daemon.bad_args", extra={"error": f"--metrics: {exc}"})
            return 2
    logs.bind_process(daemon_id=config.daemon_id)
    if os.getpid() == 1:
        # Orphans are PID 1's to reap: the daemon reaps its own slots, not what handlers start.
        log.warning("daemon.pid_one", extra={"advice": PID_ONE_ADVICE})
    # What startup made (modules, classes, the config) lives as long as the daemon: out of the
    # collector's way, so a full collection under load scans only what the tasks made.
    gc.freeze()
    return asyncio.run(_serve(config, args.metrics))


async def _serve(config: DaemonConfig, metrics: str | None = None) -> int:
    daemon = Daemon(config)
    server = None
    if metrics is not None:
        server = metrics_server(daemon.metrics, metrics)
        try:
            await server.start()
        except RuntimeError as exc:
            log.error("daemon.metrics.failed", extra={"error": str(exc)})
            return 1
    loop = asyncio.get_running_loop()

    def on_signal(signum: signal.Signals) -> None:
        if daemon.draining:
            log.info("daemon.signal", extra={"signal": signum.name, "action": "stop now"})
            daemon.stop_now()
        else:
            log.info("daemon.signal", extra={"signal": signum.name, "action": "drain"})
            daemon.drain(f"signal {signum.name}")

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await daemon.run()
    finally:
        if server is not None:
            await server.close()
    return 0
