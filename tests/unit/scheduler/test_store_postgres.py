"""What the PostgreSQL store adds to the contract: bounded waits, typed errors, reconnection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.postgres import LocalPostgres
from tests.unit.scheduler.test_store import make_job
from truba.cli import main
from truba.client import Client
from truba.client import errors as client_errors
from truba.local import free_port
from truba.scheduler import Scheduler, SchedulerConfig, server
from truba.scheduler.counters import JobCounters
from truba.scheduler.errors import StoreUnavailable, Unavailable
from truba.scheduler.model import JobState
from truba.scheduler.store_postgres import PostgresJobStore, connect_params, redact_url

NO_BROKER = "amqp://guest:guest@127.0.0.1:1/"


@pytest.fixture
def own_server() -> Iterator[LocalPostgres]:
    """A server this test may kill and restart."""
    server = LocalPostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


def test_an_unreachable_database_at_start_is_one_clear_line_without_the_password() -> None:
    url = f"postgresql://truba:s3cret@127.0.0.1:{free_port()}/jobs"
    with pytest.raises(StoreUnavailable) as caught:
        PostgresJobStore(url, timeout=1.0)
    message = str(caught.value)
    assert message.startswith(f"the store {redact_url(url)} is unreachable: ")
    assert "Connection refused" in message
    assert "\n" not in message and "s3cret" not in message
    assert isinstance(caught.value, Unavailable)  # gRPC callers would see UNAVAILABLE


def test_truba_scheduler_with_an_unreachable_store_exits_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql://truba:s3cret@127.0.0.1:{free_port()}/jobs"
    code = main(
        [
            "scheduler",
            "--broker",
            f"amqp://guest:guest@127.0.0.1:{free_port()}/",
            "--store",
            url,
            "--store-timeout",
            "1",
            "--state",
            str(tmp_path),
            "--listen",
            "127.0.0.1:0",
            "--http",
            "off",
        ]
    )
    assert code == 1
    printed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("truba scheduler:")]
    assert len(printed) == 1
    assert printed[0].startswith(f"truba scheduler: the store {redact_url(url)} is unreachable: ")
    assert "s3cret" not in printed[0]


def test_the_store_reconnects_by_itself_after_the_server_restarts(own_server: LocalPostgres) -> None:
    url = own_server.create_database()
    store = PostgresJobStore(url, timeout=2.0)
    try:
        store.insert(make_job("a", 1.0))
        own_server.kill()
        own_server.start()
        # The kept connection is dead; the first call finds out before sending anything, and
        # connects again: reads and writes go on.
        assert [j.id for j in store.list()] == ["a"]
        own_server.kill()
        own_server.start()
        store.insert(make_job("b", 2.0))
        assert [j.id for j in store.list()] == ["a", "b"]
    finally:
        store.close()


def test_calls_fail_typed_while_the_server_is_down_and_work_once_it_is_back(
    own_server: LocalPostgres,
) -> None:
    url = own_server.create_database()
    store = PostgresJobStore(url, timeout=1.0)
    try:
        store.reserve("a")
        own_server.kill()
        for call in (store.stale, lambda: store.reserve("b"), lambda: store.insert(make_job("c", 1.0))):
            with pytest.raises(StoreUnavailable, match="unreachable|failed"):
                call()
        own_server.start()
        assert list(store.stale()) == ["a"]
        store.reserve("b")
        assert list(store.stale()) == ["a", "b"]
    finally:
        store.close()


def test_a_call_blocked_on_a_lock_ends_with_store_unavailable_not_a_hang(
    postgres_server: LocalPostgres,
) -> None:
    url = postgres_server.create_database()
    store = PostgresJobStore(url, timeout=0.5)
    job = make_job("a", 1.0)
    store.insert(job)
    # Given another session holding the job's row in an open transaction
    with psycopg.connect(url) as other:
        other.execute("SELECT * FROM jobs WHERE id = 'a' FOR UPDATE")
        # When the store updates that row, it gives up after its timeout
        with pytest.raises(StoreUnavailable, match="lock timeout|statement timeout"):
            store.update(make_job("a", 1.0, state=JobState.CLOSED))
        other.rollback()
    # Then the store's connection is still good, and the update goes through now
    closed = make_job("a", 1.0, state=JobState.CLOSED, submitted=3, closed_at=2.0)
    store.update(closed)
    assert store.get("a") == closed
    store.close()


def test_a_closed_store_refuses_calls(postgres_server: LocalPostgres) -> None:
    store = PostgresJobStore(postgres_server.create_database())
    store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        store.stale()


def test_every_wait_is_bounded_and_the_url_may_set_its_own_bounds() -> None:
    params = connect_params("postgresql://u@db:5433/jobs", 2.5)
    assert params["connect_timeout"] == 3 and params["tcp_user_timeout"] == 2500
    assert "-c statement_timeout=2500" in params["options"] and "-c lock_timeout=2500" in params["options"]
    assert params["keepalives"] == 1
    # libpq counts connect_timeout in whole seconds, at least 2
    assert connect_params("postgresql://u@db/jobs", 0.3)["connect_timeout"] == 2
    own = connect_params("postgresql://u@db/jobs?connect_timeout=10&options=-c%20statement_timeout%3D9s", 1.0)
    assert own["connect_timeout"] == "10"
    assert own["options"].endswith("-c statement_timeout=9s")  # the URL's comes last, and wins
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        connect_params("postgresql://u@db/jobs?no_such_param=1", 1.0)


def test_the_password_never_shows_in_the_store_s_name() -> None:
    assert redact_url("postgresql://u:pw@db.example:5433/jobs") == "postgresql://u@db.example:5433/jobs"
    assert redact_url("postgresql:///jobs?host=/tmp/x&password=pw") == "postgresql:///jobs?host=/tmp/x"


async def test_a_scheduler_answers_unavailable_while_its_database_is_down_and_recovers(
    own_server: LocalPostgres, tmp_path: Path
) -> None:
    url = own_server.create_database()
    config = SchedulerConfig(
        brokers=[NO_BROKER], state_dir=tmp_path, listen="127.0.0.1:0", store=url, store_timeout=1.0
    )
    async with Scheduler(config) as scheduler, Client(scheduler.address) as client:
        assert await client.list_jobs(include_done=True) == []
        own_server.kill()
        with pytest.raises(client_errors.Unavailable, match=f"the store {url} is unreachable"):
            await client.list_jobs(include_done=True)
        own_server.start()
        assert await client.list_jobs(include_done=True) == []


def test_counters_the_store_could_not_take_stay_dirty_for_the_next_flush(
    postgres_server: LocalPostgres,
) -> None:
    counters = JobCounters()
    counters.client_report("j1", submitted=3, received=0, now=1.0)
    down = PostgresJobStore(postgres_server.create_database())
    down.close()  # every call now fails with StoreUnavailable
    server._store_counters(counters, down)  # the flush loop goes on
    assert set(counters.dirty()) == {"j1"}
