"""The ``truba`` command line: ``scheduler``, ``daemon``, ``up``, ``jobs``, ``daemons``, ``status``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every subcommand (also used to check docker-compose.yml)."""
    from truba.daemon import cli as daemon_cli
    from truba.local import cluster
    from truba.scheduler import cli as scheduler_cli

    parser = argparse.ArgumentParser(
        prog="truba", description="A distributed compute scheduler over RabbitMQ."
    )
    parser.add_argument("--version", action="version", version="truba 0.1.0")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    scheduler_cli.register(sub)
    daemon_cli.register(sub)
    cluster.register(sub)
    _register_jobs(sub)
    _register_status(sub)
    _register_daemons(sub)
    return parser


def _register_jobs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("jobs", help="list jobs")
    parser.add_argument("--scheduler", default="127.0.0.1:50051", metavar="HOST:PORT")
    parser.add_argument("--all", action="store_true", help="include finished and cancelled jobs")
    parser.set_defaults(func=_jobs)


def _jobs(args: argparse.Namespace) -> int:
    from truba.client import connect
    from truba.proto.v1 import jobs_pb2

    with connect(args.scheduler) as client:
        jobs = client.list_jobs(include_done=args.all)
    header = f"{'ID':<14} {'STATE':<9} {'IMPORTANCE':>10} {'SHARE':>7} {'SLOTS':>6}"
    print(f"{header} {'RUNNING':>8} {'DONE':>9} {'BACKLOG':>9}  HANDLER")
    for job in jobs:
        state = jobs_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
        c = job.counts
        share = f"{job.importance:>10g} {job.fair_share:>7.1f} {job.assigned_slots:>6}"
        counts = f"{c.running:>8} {c.done + c.failed:>9} {c.backlog:>9}"
        print(f"{job.id:<14} {state:<9} {share} {counts}  {job.handler}")
    return 0


def _register_daemons(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("daemons", help="list connected daemons; drain one for maintenance")
    parser.add_argument("--scheduler", default="127.0.0.1:50051", metavar="HOST:PORT")
    parser.add_argument(
        "--drain", metavar="DAEMON_ID", help="tell this daemon to finish its tasks, take no new ones and exit"
    )
    parser.set_defaults(func=_daemons)


def _daemons(args: argparse.Namespace) -> int:
    import grpc

    from truba.channel import Credentials, open_blocking_channel
    from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc

    credentials = Credentials.from_env()
    with open_blocking_channel(args.scheduler, credentials) as channel:
        stub = daemons_pb2_grpc.DaemonServiceStub(channel)
        try:
            if args.drain:
                info = stub.DrainDaemon(
                    daemons_pb2.DrainDaemonRequest(daemon_id=args.drain), metadata=credentials.metadata()
                )
                print(f"daemon {info.daemon_id}: draining ({sum(j.slots for j in info.assigned)} slots busy)")
                return 0
            daemons = stub.ListDaemons(
                daemons_pb2.ListDaemonsRequest(), metadata=credentials.metadata()
            ).daemons
        except grpc.RpcError as exc:
            print(f"truba daemons: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    print(f"{'DAEMON':<24} {'HOST':<16} {'SLOTS':>5} {'BUSY':>5} {'STATE':<9} JOBS")
    for d in daemons:
        busy = sum(s.busy_slots for s in d.stats)
        jobs = ", ".join(f"{j.job_id}×{j.slots}" for j in d.assigned) or "-"
        state = "draining" if d.draining else "up"
        print(f"{d.daemon_id:<24} {d.hostname:<16} {d.slots:>5} {busy:>5} {state:<9} {jobs}")
    return 0


def _register_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("status", help="check the scheduler's health; print brokers, daemons, slots")
    parser.add_argument("--scheduler", default="127.0.0.1:50051", metavar="HOST:PORT")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")
    parser.set_defaults(func=_status)


def _status(args: argparse.Namespace) -> int:
    """Exit status 0 when the scheduler answers SERVING to the standard health check."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from truba.channel import Credentials, open_blocking_channel
    from truba.pipes.broker import redact
    from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

    credentials = Credentials.from_env()
    with open_blocking_channel(args.scheduler, credentials) as channel:
        try:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=args.timeout
            )
            info = jobs_pb2_grpc.JobServiceStub(channel).GetClusterInfo(
                jobs_pb2.GetClusterInfoRequest(), timeout=args.timeout, metadata=credentials.metadata()
            )
        except grpc.RpcError as exc:
            print(f"scheduler {args.scheduler}: unreachable ({exc.code().name})", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
    print(f"scheduler {args.scheduler}: {status}; {info.daemons} daemons, {info.slots} slots")
    for broker in info.brokers:
        print(f"  broker {broker.name}: {redact(broker.url)}")
    return 0 if health.status == health_pb2.HealthCheckResponse.SERVING else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
