"""Per-job counters a daemon reports in its heartbeats, cumulative since the daemon started.

They live as long as the daemon (not as long as one runner of the job), so a job that leaves
this daemon and comes back keeps counting from where it was: the scheduler takes differences.
``service_time`` is an exponentially weighted moving average of the wall time an attempt holds a
slot, for Little's law on the scheduler's side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from truba.proto.v1 import daemons_pb2

EWMA_WEIGHT: Final = 0.2
"""Weight of the newest sample: about the last ten tasks matter."""


@dataclass
class JobStats:
    """Counters of one job on this daemon.

    ``done``/``failed`` count outcomes (a give-up is a failed outcome); ``busy`` slots run one
    of its tasks now; ``waiting`` deliveries are held but not running. The rest is for logs and
    tests: attempts requeued after a failure, retried after a handler error (``retry_on``),
    preempted, timed out, given up.
    """

    done: int = 0
    failed: int = 0
    busy: int = 0
    waiting: int = 0
    service_time: float = 0.0
    requeued: int = 0
    retried: int = 0
    preempted: int = 0
    timed_out: int = 0
    gave_up: int = 0

    def __post_init__(self) -> None:
        # Not a field: the counters are logged with dataclasses.asdict (a deep copy).
        self.first_ran: Callable[[], None] | None = None
        """Called once, when the first attempt's time is known: the daemon sizes a job's
        prefetch window by its task length, and would otherwise learn it only at its next
        reconciliation (up to a second later; a W1 run of 20,000 short tasks lasts about two)."""

    def ran(self, seconds: float) -> None:
        """An attempt held a slot for ``seconds`` and replied."""
        if self.service_time == 0.0:
            self.service_time = seconds
            if self.first_ran is not None:
                self.first_ran()
        else:
            self.service_time += EWMA_WEIGHT * (seconds - self.service_time)

    def to_proto(self, job_id: str) -> daemons_pb2.JobStats:
        return daemons_pb2.JobStats(
            job_id=job_id,
            done=self.done,
            failed=self.failed,
            busy_slots=self.busy,
            service_time=self.service_time,
            waiting=self.waiting,
        )
