"""``truba status``: the scheduler's health, its brokers, daemons and slots."""

from __future__ import annotations

import argparse

from grpc_health.v1 import health_pb2, health_pb2_grpc

from truba.cli.exits import FAILURE, OK
from truba.cli.render import cluster_dict, print_json
from truba.cli.session import add_client_arguments, session
from truba.pipes.broker import redact
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``status``."""
    parser = sub.add_parser(
        "status",
        help="check the scheduler's health; print brokers, daemons, slots",
        description="Check the scheduler's health (exit 0 when it is SERVING) and print its brokers, "
        "daemons and slots.",
    )
    add_client_arguments(parser)
    parser.set_defaults(func=status)


def status(args: argparse.Namespace) -> int:
    """Exit status 0 when the scheduler answers SERVING to the standard health check."""
    with session(args) as s:
        health = s.call(
            health_pb2_grpc.HealthStub(s.channel).Check, health_pb2.HealthCheckRequest(service="")
        )
        info = s.call(
            jobs_pb2_grpc.JobServiceStub(s.channel).GetClusterInfo, jobs_pb2.GetClusterInfoRequest()
        )
        address = s.address
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
    if args.json:
        print_json(cluster_dict(address, name, info))
    else:
        print(f"scheduler {address}: {name}; {info.daemons} daemons, {info.slots} slots")
        for broker in info.brokers:
            print(f"  broker {broker.name}: {redact(broker.url)}")
    return OK if health.status == health_pb2.HealthCheckResponse.SERVING else FAILURE
