"""The ``truba`` command line, a module per verb.

Running things: ``scheduler``, ``daemon``, ``up`` (a local cluster). Asking the scheduler:
``status``, ``jobs``, ``job ID`` (``--dead``: its dead letters), ``cancel ID``, ``daemons``,
``drain ID``, ``schedules`` (``--runs ID``), ``schedule pause|resume|delete ID`` and ``top`` (a
live view): human tables by
default, ``--json`` for machines, ``$TRUBA_SCHEDULER`` as the default address, one line on
stderr and a sysexits-like status when something fails (:mod:`truba.cli.exits`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from truba import logs
from truba.cli import daemons, jobs, schedules, status, timeline, top
from truba.cli.exits import INTERRUPTED, CliError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every subcommand (also used to check docker-compose.yml)."""
    from truba.daemon import cli as daemon_cli
    from truba.local import up
    from truba.scheduler import cli as scheduler_cli

    parser = argparse.ArgumentParser(
        prog="truba",
        description="A distributed compute scheduler over RabbitMQ.",
        epilog="Exit status: 0 done, 1 failed or refused, 2 bad usage, 69 scheduler unavailable, "
        "77 token refused, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version="truba 0.1.0")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    scheduler_cli.register(sub)
    daemon_cli.register(sub)
    up.register(sub)
    status.register(sub)
    jobs.register(sub)
    daemons.register(sub)
    schedules.register(sub)
    timeline.register(sub)
    top.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns its exit status (see :mod:`truba.cli.exits`)."""
    args = build_parser().parse_args(argv)
    if hasattr(args, "log_level"):
        level = args.log_level
        if args.verb == "up" and logs.LEVELS.index(level) < logs.LEVELS.index("warning"):
            # Its progress is its own "truba up: ..." lines; its records at info would interleave
            # with them. The level given goes to the scheduler and daemons it starts.
            level = "warning"
        logs.setup(level, args.log_format)
    try:
        result: int = args.func(args)
    except CliError as exc:
        print(f"truba {args.verb}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return INTERRUPTED
    return result


if __name__ == "__main__":
    sys.exit(main())
