"""A truba cluster of real processes for integration tests: a scheduler and daemons over the
session's RabbitMQ nodes, with their logs printed when a test fails."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from truba.local.cluster import LocalCluster, TrubaProcess

ALLOW = ["tests.handlers.*", "examples.*"]
ANY_HTTP = ("--http", "127.0.0.1:0")
"""For a scheduler restarted on its old gRPC address: its HTTP port on any free one (the default,
the gRPC port + 1, may have been taken by another process meanwhile: seen as a failed restart)."""


class Cluster:
    """A scheduler and daemons as real subprocesses over the given brokers."""

    def __init__(self, state: Path, brokers: list[object]) -> None:
        self.local = LocalCluster(state)
        self.brokers = brokers
        self.daemons: list[TrubaProcess] = []

    @property
    def broker_urls(self) -> list[str]:
        return [b.url for b in self.brokers]  # type: ignore[attr-defined]

    def start(self, daemons: int = 2, slots: int = 2) -> None:
        self.local.start_scheduler(self.broker_urls, "127.0.0.1:0", "--heartbeat-interval", "0.5")
        for i in range(daemons):
            self.daemons.append(self.local.start_daemon(f"d{i}", slots, ALLOW))
        self.local.wait_for_daemons(daemons)

    @property
    def address(self) -> str:
        return self.local.address

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()[-4000:]}" for p in self.local.processes)


@contextlib.asynccontextmanager
async def running(state: Path, brokers: list[object], daemons: int, slots: int) -> AsyncIterator[Cluster]:
    """A started cluster, stopped afterwards; on a failure its processes' logs are printed."""
    cluster = Cluster(state, brokers)
    try:
        await asyncio.to_thread(cluster.start, daemons, slots)
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        await asyncio.to_thread(cluster.local.stop)


def queues_of(job_id: str, brokers: list[object]) -> list[str]:
    """Names of the job's queues that exist on any of ``brokers``."""
    names = []
    for broker in brokers:
        names += [q for q in broker.list_queues() if job_id in q]  # type: ignore[attr-defined]
    return names
