"""A job's tasks running now, from the client: which task, on which daemon (host) and slot, which
attempt, since when.

:func:`read_running` asks the scheduler (``ListRunning``), which answers from each daemon's last
heartbeat (so the list is at most a heartbeat interval old: a task that just started may not be
in it yet, one that just ended may still be). Each :class:`RunningTask` is a frozen record;
``str()`` of one (or of a :class:`RunningTasks` list) is one printable line per task.
``started_at`` is the daemon's wall clock; ``for_seconds`` is how long the task had run when the
scheduler answered, by the scheduler's clock (never below 0, whatever the clocks' skew).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from truba.client.reach import Reach
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc


@dataclass(frozen=True, slots=True)
class RunningTask:
    """One task attempt in progress: the task, where it runs, its attempt number, since when."""

    task_id: str
    daemon_id: str
    hostname: str
    slot: int
    attempt: int
    """1 for the first attempt."""
    started_at: datetime
    """When the attempt started (aware, UTC; the daemon's clock)."""
    for_seconds: float
    """How long it had run when the scheduler answered."""

    @classmethod
    def from_pb(cls, task: jobs_pb2.RunningTask, at: float) -> RunningTask:
        """``task`` as of ``at`` (the answer's Unix time)."""
        return cls(
            task_id=task.task_id,
            daemon_id=task.daemon_id,
            hostname=task.hostname,
            slot=task.slot,
            attempt=task.attempt,
            started_at=datetime.fromtimestamp(task.started_at, UTC),
            for_seconds=max(0.0, at - task.started_at),
        )

    def describe(self) -> str:
        """One line: task, daemon (host), slot, attempt, since when and for how long."""
        host = f" ({self.hostname})" if self.hostname and self.hostname != self.daemon_id else ""
        since = self.started_at.isoformat(timespec="seconds")
        return (
            f"{self.task_id}  on {self.daemon_id}{host} slot {self.slot}, attempt {self.attempt}, "
            f"since {since} ({self.for_seconds:.1f} s)"
        )

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class RunningTasks(Sequence[RunningTask]):
    """A job's tasks running now, oldest start first, as the scheduler answered at ``at``.

    ``left_out`` counts attempts in progress that are not in the list (over the answer's bound,
    or over a daemon's per-heartbeat bound).
    """

    tasks: tuple[RunningTask, ...]
    at: datetime
    left_out: int = 0

    @classmethod
    def from_pb(cls, answer: jobs_pb2.ListRunningResponse) -> RunningTasks:
        return cls(
            tuple(RunningTask.from_pb(task, answer.at) for task in answer.running),
            datetime.fromtimestamp(answer.at, UTC),
            answer.left_out,
        )

    def __getitem__(self, index: int) -> RunningTask:  # type: ignore[override]
        return self.tasks[index]

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[RunningTask]:
        return iter(self.tasks)

    def describe(self) -> str:
        """One line per task (or ``nothing running``), then how many more run unlisted."""
        lines = [task.describe() for task in self.tasks] or ["nothing running"]
        if self.left_out:
            lines.append(f"(and {self.left_out} more, not listed)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


async def read_running(
    reach: Reach, jobs: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, *, limit: int = 0
) -> RunningTasks:
    """The job's tasks running now, at most ``limit`` (0: the scheduler's bound of 10000).

    Raises:
        NotFound: no such job.
        Unavailable: no answer within the client's patience (``unavailable_after``).
    """
    request = jobs_pb2.ListRunningRequest(job_id=job_id, limit=limit)
    answer = await reach.call("ListRunning", lambda t: jobs.ListRunning(request, timeout=t))
    return RunningTasks.from_pb(answer)
