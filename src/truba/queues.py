"""A job's queues: their names and how they are declared, the one place that spells both.

The scheduler declares them when a job is created; the client's and the daemon's pipes declare
them again when they reconnect to a broker that lost them (its data was wiped, or it was
replaced), so the same specification must be at hand on every side.
"""

from __future__ import annotations

from dataclasses import dataclass

from truba.pipes.broker import QueueSpec
from truba.proto.v1 import common_pb2

MAX_PRIORITY = 9
"""Task priorities are 0 (the default) to 9: RabbitMQ advises few levels (each costs memory and
CPU in the queue)."""


@dataclass(frozen=True)
class JobQueues:
    """Names of one job's queues (each exists once on every broker) and their RabbitMQ type.

    The task queue takes delayed tasks: declaring it declares the broker's delay levels (once per
    connection) and binds it to them (:mod:`truba.pipes.delay`).

    ``kind`` is the type of the task and result queues, ``"quorum"`` or ``"classic"``; the
    dead-letter queue is always classic (it is only read by people and tools).
    """

    tasks: str
    results: str
    dead: str
    kind: str = "quorum"
    priorities: bool = False
    """The task queue is a priority queue (levels 0..:data:`MAX_PRIORITY`)."""

    @property
    def marker(self) -> str:
        """A queue only clients declare and scheduler deletes: a broker on which it is missing
        lost its data (see :mod:`truba.client.watch`)."""
        return self.tasks.removesuffix(".tasks") + ".marker"

    @property
    def result_log(self) -> str:
        """The stream every result is copied to, in the same confirm: which tasks have a
        confirmed result, for a daemon that gets a half-done frame back (see truba.pipes.result_log)."""
        return self.results.removesuffix(".results") + ".done"

    def all(self) -> tuple[str, str, str, str]:
        """The four names, dead-letter queue first (tasks and results dead-letter into it)."""
        return (self.dead, self.tasks, self.results, self.result_log)

    def specs(self) -> tuple[QueueSpec, QueueSpec, QueueSpec, QueueSpec]:
        """How to declare them, in :meth:`all` order."""
        return (
            QueueSpec(self.dead, kind="classic"),
            QueueSpec(
                self.tasks,
                kind=self.kind,
                dead_letter_to=self.dead,
                max_priority=MAX_PRIORITY if self.priorities else None,
                delays=True,
            ),
            QueueSpec(self.results, kind=self.kind, dead_letter_to=self.dead),
            QueueSpec(self.result_log, kind="stream"),
        )

    def spec(self, name: str) -> QueueSpec:
        """The spec of one of the four queues.

        Raises:
            KeyError: ``name`` is not one of them.
        """
        for spec in self.specs():
            if spec.name == name:
                return spec
        raise KeyError(name)


def queues_of(queues: common_pb2.JobQueues, settings: common_pb2.JobSettings) -> JobQueues:
    """A job's queues as the scheduler describes them (CreateJob, GetJob, assignments)."""
    kind = "classic" if settings.queue_type == common_pb2.QUEUE_TYPE_CLASSIC else "quorum"
    return JobQueues(queues.tasks, queues.results, queues.dead, kind=kind, priorities=settings.priorities)


def job_queues(job_id: str, kind: str = "quorum", *, priorities: bool = False) -> JobQueues:
    """The queues of job ``job_id``."""
    prefix = f"truba.job.{job_id}"
    return JobQueues(
        tasks=f"{prefix}.tasks",
        results=f"{prefix}.results",
        dead=f"{prefix}.dead",
        kind=kind,
        priorities=priorities,
    )
