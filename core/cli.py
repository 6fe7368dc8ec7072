"""The ``truba`` command line: ``truba scheduler``, ``truba daemon``, ``truba up``, ``truba jobs``."""

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
    print(f"{'ID':<16} {'STATE':<10} {'IMPORTANCE':>10} {'SLOTS':>6} {'SUBMITTED':>10}  HANDLER")
    for job in jobs:
        state = jobs_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
        counts = f"{job.importance:>10g} {job.assigned_slots:>6} {job.submitted:>10}"
        print(f"{job.id:<16} {state:<10} {counts}  {job.handler}")
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

    from truba.pipes.rabbit import redact
    from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

    with grpc.insecure_channel(args.scheduler) as channel:
        try:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=args.timeout
            )
            info = jobs_pb2_grpc.JobServiceStub(channel).GetClusterInfo(
                jobs_pb2.GetClusterInfoRequest(), timeout=args.timeout
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
