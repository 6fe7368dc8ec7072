"""The schedule store's contract, on SQLite and PostgreSQL: the lease is one conditional UPDATE."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from tests.unit.scheduler.conftest import StoreBackend
from truba.scheduler.schedule_model import KEEP_RUNS, RunOutcome, Schedule, ScheduleRun, ScheduleState
from truba.scheduler.schedule_store import LOST_BY_LEASE, ScheduleStore
from truba.scheduler.store import JobStore

T0 = 1_750_000_000.0


def make_schedule(schedule_id: str = "s1", **changes: object) -> Schedule:
    schedule = Schedule(
        id=schedule_id,
        handler="examples.math:square",
        job_id="job1",
        every=1.0,
        cron="",
        payload=b"\x05",
        deadline=0.5,
        importance=2.0,
        created_at=T0,
        next_due=T0,
        name="tick",
    )
    return replace(schedule, **changes)  # type: ignore[arg-type]


@pytest.fixture
def jobs(backend: StoreBackend) -> Iterator[JobStore]:
    store = backend.open()
    yield store
    store.close()


@pytest.fixture
def store(jobs: JobStore) -> ScheduleStore:
    return jobs.schedules


def claim(store: ScheduleStore, schedule: Schedule, now: float, task_id: str) -> bool:
    return store.claim(
        schedule, now=now, lease_until=now + 1.5, next_due=schedule.next_due + 1, task_id=task_id
    )


def test_a_schedule_reads_back_as_written_and_survives_reopening(backend: StoreBackend) -> None:
    first = backend.open()
    schedule = make_schedule(cron="*/5 * * * *", every=0.0, payload=b"\x00\xff" * 10)
    first.schedules.add(schedule)
    with pytest.raises(KeyError):
        first.schedules.add(schedule)
    first.close()
    second = backend.open()
    assert second.schedules.get("s1") == schedule
    assert second.schedules.get("nope") is None
    assert list(second.schedules.list()) == [schedule]
    second.close()


def test_a_due_schedule_is_claimed_once_and_not_again_while_its_lease_holds(store: ScheduleStore) -> None:
    schedule = make_schedule()
    store.add(schedule)
    assert claim(store, schedule, T0 + 0.01, "run-1")
    # the same due time seen again (a second loop, a stale cache): refused
    assert not claim(store, schedule, T0 + 0.02, "run-1b")
    held = store.get("s1")
    assert held is not None and held.run_task == "run-1" and held.runs == 1
    assert held.lease_until == T0 + 1.51 and held.next_due == T0 + 1
    # due again but the lease still holds: refused
    assert not claim(store, held, T0 + 1.2, "run-2")
    assert [(r.task_id, r.outcome) for r in store.runs("s1")] == [("run-1", RunOutcome.RUNNING)]


def test_a_schedule_not_due_or_paused_is_not_claimed(store: ScheduleStore) -> None:
    store.add(make_schedule(next_due=T0 + 5))
    assert not claim(store, store.get("s1"), T0, "run-1")  # type: ignore[arg-type]
    store.add(make_schedule("s2", state=ScheduleState.PAUSED))
    assert not claim(store, store.get("s2"), T0 + 1, "run-1")  # type: ignore[arg-type]
    assert store.set_state("s2", ScheduleState.ACTIVE, T0 + 2)
    assert claim(store, store.get("s2"), T0 + 2, "run-1")  # type: ignore[arg-type]


def test_an_expired_lease_lets_the_next_claim_through_and_counts_the_run_lost(store: ScheduleStore) -> None:
    store.add(make_schedule())
    assert claim(store, store.get("s1"), T0, "run-1")  # type: ignore[arg-type]
    held = store.get("s1")
    assert held is not None
    assert claim(store, held, held.lease_until, "run-2")
    runs = store.runs("s1")
    assert [(r.task_id, r.outcome) for r in runs] == [
        ("run-2", RunOutcome.RUNNING),
        ("run-1", RunOutcome.LOST),
    ]
    assert runs[1].error == LOST_BY_LEASE


def test_an_outcome_frees_the_lease_and_a_late_one_changes_nothing(store: ScheduleStore) -> None:
    store.add(make_schedule())
    assert claim(store, store.get("s1"), T0, "run-1")  # type: ignore[arg-type]
    ok = ScheduleRun("s1", "run-1", 0, 0, T0 + 0.3, RunOutcome.OK, "", 0.25, "d1")
    assert store.finish(ok)
    freed = store.get("s1")
    assert freed is not None and freed.lease_until == 0 and freed.run_task == ""
    (run,) = store.runs("s1")
    assert (run.due, run.started, run.ended, run.outcome, run.duration, run.daemon_id) == (
        T0,
        T0,
        T0 + 0.3,
        RunOutcome.OK,
        0.25,
        "d1",
    )
    # run-2 holds the schedule; a second result of run-1 neither changes it nor frees run-2's lease
    assert claim(store, freed, T0 + 1, "run-2")
    assert not store.finish(replace(ok, outcome=RunOutcome.ERROR, error="ValueError: late"))
    held = store.get("s1")
    assert held is not None and held.run_task == "run-2" and held.lease_until > 0
    assert store.runs("s1", 5)[1].outcome is RunOutcome.OK


def test_only_the_newest_runs_are_kept(store: ScheduleStore) -> None:
    store.add(make_schedule())
    for n in range(KEEP_RUNS + 5):
        schedule = store.get("s1")
        assert schedule is not None
        now = schedule.next_due
        assert claim(store, schedule, now, f"run-{n}")
        store.finish(ScheduleRun("s1", f"run-{n}", 0, 0, now + 0.1, RunOutcome.OK))
    runs = store.runs("s1")
    assert len(runs) == KEEP_RUNS
    assert runs[0].task_id == f"run-{KEEP_RUNS + 4}" and runs[-1].task_id == "run-5"
    assert [r.task_id for r in store.runs("s1", 2)] == [f"run-{KEEP_RUNS + 4}", f"run-{KEEP_RUNS + 3}"]


def test_removing_a_schedule_removes_its_runs(store: ScheduleStore) -> None:
    store.add(make_schedule())
    assert claim(store, store.get("s1"), T0, "run-1")  # type: ignore[arg-type]
    assert store.remove("s1")
    assert not store.remove("s1")
    assert store.get("s1") is None and store.runs("s1") == []
    assert not store.set_state("s1", ScheduleState.PAUSED, T0)
