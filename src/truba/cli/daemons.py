"""``truba daemons`` (list; ``--drain ID``) and ``truba drain ID``."""

from __future__ import annotations

import argparse

from truba.cli.exits import OK
from truba.cli.render import daemon_dict, print_json, print_table
from truba.cli.session import Session, add_client_arguments, session
from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``daemons`` and ``drain``."""
    parser = sub.add_parser(
        "daemons",
        help="list connected daemons; drain one for maintenance",
        description="List the daemons connected to the scheduler: slots, busy slots, state and jobs.",
    )
    add_client_arguments(parser)
    parser.add_argument(
        "--drain", metavar="DAEMON_ID", help="tell this daemon to finish its tasks, take no new ones and exit"
    )
    parser.set_defaults(func=list_daemons)

    parser = sub.add_parser(
        "drain",
        help="drain a daemon (the same as daemons --drain)",
        description="Tell a daemon to finish the tasks it runs, take no new ones and exit.",
    )
    parser.add_argument("drain", metavar="DAEMON_ID", help="the daemon's id (truba daemons lists them)")
    add_client_arguments(parser)
    parser.set_defaults(func=list_daemons)


def list_daemons(args: argparse.Namespace) -> int:
    with session(args) as s:
        if args.drain:
            return _drain(s, args.drain, as_json=args.json)
        stub = daemons_pb2_grpc.DaemonServiceStub(s.channel)
        daemons = s.call(stub.ListDaemons, daemons_pb2.ListDaemonsRequest()).daemons
    rows = [daemon_dict(d) for d in daemons]
    if args.json:
        print_json(rows)
        return OK
    table = [
        [
            row["id"],
            row["hostname"],
            row["slots"],
            row["busy"],
            row["state"],
            ", ".join(f"{j.job_id}×{j.slots}" for j in d.assigned) or "-",
        ]
        for row, d in zip(rows, daemons, strict=True)
    ]
    print_table(["DAEMON", "HOST", "SLOTS", "BUSY", "STATE", "JOBS"], table, right=frozenset({2, 3}))
    return OK


def _drain(s: Session, daemon_id: str, *, as_json: bool) -> int:
    stub = daemons_pb2_grpc.DaemonServiceStub(s.channel)
    info = s.call(stub.DrainDaemon, daemons_pb2.DrainDaemonRequest(daemon_id=daemon_id))
    if as_json:
        print_json(daemon_dict(info))
    else:
        print(f"daemon {info.daemon_id}: draining ({sum(j.slots for j in info.assigned)} slots busy)")
    return OK
