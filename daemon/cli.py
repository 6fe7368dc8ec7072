"""``truba daemon``: run a compute daemon on this node."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from truba import logs
from truba.daemon.daemon import Daemon, DaemonConfig

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``daemon`` subcommand."""
    parser = subparsers.add_parser("daemon", help="run a compute daemon on this node")
    parser.add_argument(
        "--scheduler", default="127.0.0.1:50051", metavar="HOST:PORT", help="scheduler address"
    )
    parser.add_argument(
        "--slots", type=int, default=os.cpu_count() or 1, metavar="N", help="slot processes (default: CPUs)"
    )
    parser.add_argument(
        "--allow",
        action="append",
        required=True,
        metavar="PATTERN",
        help="fnmatch pattern of handlers ('package.module:function') this daemon may import; repeatable",
    )
    parser.add_argument("--id", dest="daemon_id", default=None, help="daemon id (default: host-pid)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="json", choices=["json", "text"])
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    logs.setup(args.log_level, args.log_format)
    if args.slots < 1:
        log.error("daemon.bad_args", extra={"error": "--slots must be >= 1"})
        return 2
    config = DaemonConfig(args.scheduler, args.slots, list(args.allow))
    if args.daemon_id:
        config.daemon_id = args.daemon_id
    logs.bind_process(daemon_id=config.daemon_id)
    return asyncio.run(_serve(config))


async def _serve(config: DaemonConfig) -> int:
    daemon = Daemon(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, daemon.stop)
    await daemon.run()
    return 0
