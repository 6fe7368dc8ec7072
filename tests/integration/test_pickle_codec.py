"""A job with codec="pickle" on real processes: refused (with a clear outcome) by a daemon
started without --allow-pickle, run by one started with it."""

from __future__ import annotations

import fractions
from collections.abc import Iterator
from pathlib import Path

import pytest

import truba
from tests.handlers import basic
from tests.integration.processes import ALLOW, Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(rabbit_nodes: list[object], tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, rabbit_nodes)
    try:
        yield running
    except BaseException:
        print(running.logs())
        raise
    finally:
        running.local.stop()


def start(cluster: Cluster, *extra: str) -> None:
    cluster.local.start_scheduler(cluster.broker_urls, "127.0.0.1:0", "--heartbeat-interval", "0.5")
    cluster.daemons.append(cluster.local.start_daemon("d0", 1, ALLOW, *extra))
    cluster.local.wait_for_daemons(1)


def test_a_pickle_job_is_refused_with_an_outcome_by_a_daemon_without_allow_pickle(cluster: Cluster) -> None:
    start(cluster)
    with truba.connect(cluster.address) as client:
        job = client.create_job(basic.echo, codec="pickle", max_attempts=3)
        [outcome] = job.map([{1, 2}], window=1)
    assert not outcome.ok and outcome.error is not None and outcome.error.type == "PickleRefused"
    assert "--allow-pickle" in outcome.error.message and outcome.attempts == 1


def test_a_pickle_job_runs_on_a_daemon_with_allow_pickle(cluster: Cluster) -> None:
    start(cluster, "--allow-pickle")
    payloads = [{1, 2}, fractions.Fraction(1, 3), frozenset("ab")]
    with truba.connect(cluster.address) as client:
        job = client.create_job(basic.echo, codec="pickle")
        outcomes = list(job.map(payloads))
    assert [o.result() for o in outcomes] == payloads
