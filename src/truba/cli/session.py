"""What every command that talks to the scheduler shares: its flags and one bounded call.

``--scheduler`` defaults to ``$TRUBA_SCHEDULER``, then ``127.0.0.1:50051``; an address without a
port means port 50051. Every call has a deadline (``--timeout``, 3 s by default), which also
bounds the connection: a port that accepts and never answers fails like a dead one, as
:data:`~truba.cli.exits.UNAVAILABLE`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, TypeVar

import grpc

from truba import logs
from truba.channel import Credentials, default_scheduler, open_blocking_channel, scheduler_target
from truba.cli.exits import CliError, rpc_failed

DEFAULT_TIMEOUT: Final = 3.0
"""Seconds a command waits for the scheduler (connecting included)."""
LOG_LEVEL: Final = "warning"
LOG_FORMAT: Final = "text"
"""The verbs that ask the scheduler are for people at a terminal: only what went wrong is logged,
readably, so that a failed command still ends in its one line on stderr."""

Resp = TypeVar("Resp")


def add_client_arguments(parser: argparse.ArgumentParser, *, json: bool = True) -> None:
    """Adds ``--scheduler``, ``--timeout``, (with ``json``) ``--json``, and ``--log-level`` and
    ``--log-format`` to ``parser``."""
    parser.add_argument(
        "--scheduler",
        default=default_scheduler(),
        metavar="HOST[:PORT][,...]",
        help="the scheduler's address, or several comma-separated (high availability: the leader is"
        " followed); default: $TRUBA_SCHEDULER, else 127.0.0.1:50051; port 50051 if none",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"give up when the scheduler does not answer within this (default {DEFAULT_TIMEOUT:g})",
    )
    if json:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    logs.add_arguments(parser, level=LOG_LEVEL, fmt=LOG_FORMAT)


@dataclass(frozen=True)
class Session:
    """A blocking channel to the scheduler, with the caller's token and deadline on every call."""

    channel: grpc.Channel
    address: str
    timeout: float
    credentials: Credentials

    def call(self, method: Callable[..., Resp], request: object) -> Resp:
        """``method(request)`` with the deadline and token.

        Raises:
            CliError: the call failed (unreachable, timed out, refused), as one line.
        """
        try:
            return method(request, timeout=self.timeout, metadata=self.credentials.metadata())
        except grpc.RpcError as exc:
            raise rpc_failed(exc, self.address, self.timeout) from None


@contextlib.contextmanager
def session(args: argparse.Namespace) -> Iterator[Session]:
    """A :class:`Session` for the ``--scheduler`` and ``--timeout`` in ``args``, closed afterwards.

    Raises:
        CliError: the TLS root in ``$TRUBA_TLS_CA`` cannot be read.
    """
    address = scheduler_target(args.scheduler)
    credentials = Credentials.from_env()
    try:
        channel = open_blocking_channel(address, credentials)
    except OSError as exc:
        raise CliError(f"cannot read the TLS root {credentials.tls_ca}: {exc.strerror or exc}") from None
    with channel:
        yield Session(channel, address, args.timeout, credentials)
