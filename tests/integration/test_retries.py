"""Retries on exceptions with real processes: scheduler + a daemon + 2 brokers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import truba
from tests.handlers import flaky
from tests.integration.processes import ALLOW, Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(rabbit_nodes: list[object], tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, rabbit_nodes)
    try:
        running.start(daemons=1, slots=2)
        yield running
    except BaseException:
        print(running.logs())
        raise
    finally:
        running.local.stop()


def test_a_handler_busy_twice_then_done_gives_a_result_after_3_attempts_and_others_fail_at_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    with truba.connect(cluster.address) as client:
        job = client.create_job(
            flaky.busy_twice, retry_on=[flaky.Busy], backoff=(0.05, 0.2), max_attempts=3, queue_type="classic"
        )
        (retried,) = job.map([str(tmp_path / "busy")])
        other = client.create_job(flaky.broken, retry_on=["tests.handlers.flaky.Busy"], max_attempts=3)
        (failed,) = other.map([str(tmp_path / "broken")])
    assert retried.ok and retried.value == 3 and retried.attempts == 3
    assert not failed.ok and failed.attempts == 1 and not failed.gave_up
    assert failed.error is not None and failed.error.type == "ValueError"
    assert (tmp_path / "broken").read_text() == "1"  # ran once: not retried


def test_a_daemon_killed_while_a_task_waits_out_its_backoff_loses_nothing_and_counts_the_attempt(
    cluster: Cluster, tmp_path: Path
) -> None:
    counter = tmp_path / "busy"
    with truba.connect(cluster.address) as client:
        job = client.create_job(flaky.busy_twice, retry_on=[flaky.Busy], backoff=(4.0, 4.0), max_attempts=3)
        job.submit(str(counter))
        job.close()
        # Given the first attempt failed and its task waits out its backoff (2-4 s) on d0
        deadline = time.monotonic() + 60
        while not (counter.exists() and counter.read_text() == "1"):
            assert time.monotonic() < deadline, "the first attempt did not run"
            time.sleep(0.05)
        time.sleep(0.5)
        # When that daemon dies and another takes over
        cluster.daemons[0].kill()
        cluster.daemons.append(cluster.local.start_daemon("d1", 2, ALLOW))
        [outcome] = list(job.results())
    # Then the task was not lost, and the attempt the dead daemon spent is counted
    assert outcome.ok and outcome.value == 3 and outcome.attempts == 3
