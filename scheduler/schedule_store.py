"""Where schedules and their last runs are kept: :class:`ScheduleStore`, on either database.

The statements are the same on SQLite and PostgreSQL (written with ``?`` placeholders; the
PostgreSQL runner turns them into ``%s``); each job store hands its connection over as a
:class:`SqlRunner` (``JobStore.schedules``), so schedules live in the same database, under the
same bounds and errors (:class:`~truba.scheduler.errors.StoreUnavailable`), as the jobs.

**The lease.** A schedule fires only through :meth:`ScheduleStore.claim`: one conditional
UPDATE that takes the schedule only while it is active, due at the time the caller saw, and
not held by an unexpired lease (seed 003's ``UPDATE ... WHERE lease < now``). Its transaction
also counts a run still marked running (its lease expired without an outcome) as lost, and
records the new run. :meth:`ScheduleStore.finish` records a run's outcome and releases the
lease if that run still holds it. Nothing else takes or frees a lease, so a scheduler killed at
any point leaves either a held lease that expires by itself or a free one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TypeVar, final

from truba.scheduler.schedule_model import KEEP_RUNS, RunOutcome, Schedule, ScheduleRun, ScheduleState

T = TypeVar("T")

SCHEDULE_COLUMNS: Final = (
    "id, name, handler, job_id, every, cron, payload, deadline, importance, state, created_at,"
    " next_due, lease_until, run_task, runs"
)
RUN_COLUMNS: Final = "schedule_id, task_id, due, started, ended, outcome, error, duration, daemon_id"
LOST_BY_LEASE: Final = "LeaseExpired: no outcome came back before the run's lease expired"


class Tx(Protocol):
    """Statements inside one transaction."""

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Runs ``sql``; the number of rows it changed."""


class SqlRunner(Protocol):
    """A database as the schedule store needs it: reads in autocommit, writes in a transaction."""

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...

    def transaction(self, work: Callable[[Tx], T]) -> T: ...


@final
class ScheduleStore:
    """Schedules and their newest :data:`KEEP_RUNS` runs; see the module for the lease.

    Every call may raise :class:`~truba.scheduler.errors.StoreUnavailable` (PostgreSQL).
    """

    def __init__(self, db: SqlRunner) -> None:
        self._db = db

    def add(self, schedule: Schedule) -> None:
        """Stores a new schedule.

        Raises:
            KeyError: a schedule with that id exists.
        """
        if self.get(schedule.id) is not None:
            raise KeyError(schedule.id)
        marks = ",".join("?" * len(SCHEDULE_COLUMNS.split(",")))
        self._db.transaction(
            lambda tx: tx.execute(
                f"INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES ({marks})", _row(schedule)
            )
        )

    def get(self, schedule_id: str) -> Schedule | None:
        rows = self._db.rows(f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = ?", (schedule_id,))
        return _schedule(rows[0]) if rows else None

    def list(self) -> Sequence[Schedule]:
        """Every schedule, oldest first."""
        rows = self._db.rows(f"SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY created_at, id")
        return [_schedule(row) for row in rows]

    def set_state(self, schedule_id: str, state: ScheduleState, next_due: float) -> bool:
        """Pauses or resumes a schedule (with its next due time); False if there is none."""
        return (
            self._db.transaction(
                lambda tx: tx.execute(
                    "UPDATE schedules SET state = ?, next_due = ? WHERE id = ?",
                    (state.value, next_due, schedule_id),
                )
            )
            == 1
        )

    def remove(self, schedule_id: str) -> bool:
        """Deletes a schedule and its runs; False if there was none."""

        def remove(tx: Tx) -> int:
            tx.execute("DELETE FROM schedule_runs WHERE schedule_id = ?", (schedule_id,))
            return tx.execute("DELETE FROM schedules WHERE id = ?", (schedule_id,))

        return self._db.transaction(remove) == 1

    def claim(
        self, schedule: Schedule, *, now: float, lease_until: float, next_due: float, task_id: str
    ) -> bool:
        """Takes ``schedule`` for one run due at ``schedule.next_due``, fired at ``now``: True if
        this call took it (it was active, still due at that time, and no unexpired lease held it).

        In the same transaction, a run left running by an expired lease is counted lost and the
        new run is recorded as running.
        """

        def claim(tx: Tx) -> bool:
            taken = tx.execute(
                "UPDATE schedules SET lease_until = ?, next_due = ?, run_task = ?, runs = runs + 1"
                " WHERE id = ? AND state = ? AND next_due = ? AND next_due <= ? AND lease_until <= ?",
                (
                    lease_until,
                    next_due,
                    task_id,
                    schedule.id,
                    ScheduleState.ACTIVE.value,
                    schedule.next_due,
                    now,
                    now,
                ),
            )
            if taken != 1:
                return False
            tx.execute(
                "UPDATE schedule_runs SET outcome = ?, ended = ?, error = ?"
                " WHERE schedule_id = ? AND outcome = ?",
                (RunOutcome.LOST.value, now, LOST_BY_LEASE, schedule.id, RunOutcome.RUNNING.value),
            )
            run = ScheduleRun(schedule.id, task_id, due=schedule.next_due, started=now)
            tx.execute(f"INSERT INTO schedule_runs ({RUN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", _run_row(run))
            return True

        return self._db.transaction(claim)

    def finish(self, run: ScheduleRun) -> bool:
        """Records the outcome of a run still marked running, and releases the schedule's lease if
        that run holds it; True if the run was running (False: unknown, or already counted lost).
        Older runs beyond :data:`KEEP_RUNS` are deleted."""

        def finish(tx: Tx) -> bool:
            changed = tx.execute(
                "UPDATE schedule_runs SET ended = ?, outcome = ?, error = ?, duration = ?, daemon_id = ?"
                " WHERE schedule_id = ? AND task_id = ? AND outcome = ?",
                (
                    run.ended,
                    run.outcome.value,
                    run.error,
                    run.duration,
                    run.daemon_id,
                    run.schedule_id,
                    run.task_id,
                    RunOutcome.RUNNING.value,
                ),
            )
            tx.execute(
                "UPDATE schedules SET lease_until = 0, run_task = '' WHERE id = ? AND run_task = ?",
                (run.schedule_id, run.task_id),
            )
            tx.execute(
                "DELETE FROM schedule_runs WHERE schedule_id = ? AND task_id NOT IN (SELECT task_id FROM"
                " schedule_runs WHERE schedule_id = ? ORDER BY started DESC LIMIT ?)",
                (run.schedule_id, run.schedule_id, KEEP_RUNS),
            )
            return changed == 1

        return self._db.transaction(finish)

    def runs(self, schedule_id: str, limit: int = 0) -> Sequence[ScheduleRun]:
        """The schedule's runs, newest first (``limit`` 0: every one kept)."""
        rows = self._db.rows(
            f"SELECT {RUN_COLUMNS} FROM schedule_runs WHERE schedule_id = ?"
            " ORDER BY started DESC, task_id DESC LIMIT ?",
            (schedule_id, limit or KEEP_RUNS),
        )
        return [_run(row) for row in rows]


def _row(s: Schedule) -> tuple[object, ...]:
    return (
        s.id,
        s.name,
        s.handler,
        s.job_id,
        s.every,
        s.cron,
        s.payload,
        s.deadline,
        s.importance,
        s.state.value,
        s.created_at,
        s.next_due,
        s.lease_until,
        s.run_task,
        s.runs,
    )


def _schedule(row: Sequence[Any]) -> Schedule:
    (
        sid,
        name,
        handler,
        job_id,
        every,
        cron,
        payload,
        deadline,
        importance,
        state,
        created,
        due,
        lease,
        task,
        runs,
    ) = row
    return Schedule(
        id=str(sid),
        name=str(name),
        handler=str(handler),
        job_id=str(job_id),
        every=float(every),
        cron=str(cron),
        payload=bytes(payload),
        deadline=float(deadline),
        importance=float(importance),
        state=ScheduleState(state),
        created_at=float(created),
        next_due=float(due),
        lease_until=float(lease),
        run_task=str(task),
        runs=int(runs),
    )


def _run_row(r: ScheduleRun) -> tuple[object, ...]:
    return (
        r.schedule_id,
        r.task_id,
        r.due,
        r.started,
        r.ended,
        r.outcome.value,
        r.error,
        r.duration,
        r.daemon_id,
    )


def _run(row: Sequence[Any]) -> ScheduleRun:
    sid, task_id, due, started, ended, outcome, error, duration, daemon_id = row
    return ScheduleRun(
        schedule_id=str(sid),
        task_id=str(task_id),
        due=float(due),
        started=float(started),
        ended=float(ended),
        outcome=RunOutcome(outcome),
        error=str(error),
        duration=float(duration),
        daemon_id=str(daemon_id),
    )
