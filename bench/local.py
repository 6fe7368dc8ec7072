"""What the end-to-end benchmarks run against: one local broker, a scheduler and one daemon."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from truba.local import LocalRabbitNode, start_nodes
from truba.local.cluster import LocalCluster, TrubaProcess


@dataclass(frozen=True)
class Bench:
    """The running parts, and a folder for the benchmark's own files."""

    node: LocalRabbitNode
    cluster: LocalCluster
    daemon: TrubaProcess
    tmp: Path
    nodes: tuple[LocalRabbitNode, ...] = ()


@contextmanager
def one_daemon_cluster(prefix: str, slots: int, brokers: int = 1) -> Iterator[Bench]:
    """Starts the brokers, the scheduler and a daemon of ``slots`` slots; stops them after.

    ``node`` is the first broker; :attr:`Bench.nodes` has them all."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        tmp = Path(folder)
        nodes = start_nodes(tmp / "rmq", brokers)
        cluster = LocalCluster(tmp / "cluster")
        try:
            cluster.start_scheduler([node.url for node in nodes], "127.0.0.1:0")
            daemon = cluster.start_daemon("d0", slots, ["tests.handlers.*"])
            cluster.wait_for_daemons(1)
            yield Bench(nodes[0], cluster, daemon, tmp, tuple(nodes))
        finally:
            cluster.stop()
            for node in nodes:
                node.stop()
