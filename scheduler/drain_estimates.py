"""The planner's ``ends`` from what daemons report: when each running task is expected to end.

Every heartbeat carries the daemon's attempts in progress with their start times
(:mod:`~truba.scheduler.running`) and, per job, a moving average of its task run time there
(``JobStats.service_time``). A task that started ``e`` seconds ago of a job whose tasks take
``m`` on average is expected to end in ``m - e`` (:func:`~truba.scheduler.drains.expected_ends`
for late ones). Nothing is computed per heartbeat: :class:`ReportedEnds` reads a daemon's last
report only when the planner asks about one of its jobs (the donors of a move, the jobs it
sheds), once per plan.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar, final, overload

from truba.proto.v1 import daemons_pb2
from truba.scheduler.drains import expected_ends
from truba.scheduler.running import DaemonRunning

T = TypeVar("T")


class Reporting(Protocol):
    """A daemon as :class:`ReportedEnds` reads it (a :class:`~truba.scheduler.registry.DaemonSession`)."""

    @property
    def daemon_id(self) -> str: ...

    @property
    def running(self) -> DaemonRunning: ...

    @property
    def stats(self) -> Sequence[daemons_pb2.JobStats]: ...

    @property
    def last_seen(self) -> float: ...


@final
class ReportedEnds(Mapping[tuple[str, str], Sequence[float]]):
    """(daemon id, job id) -> expected ends of the job's running tasks there, on the planner's clock.

    Args:
        sessions: the connected daemons.
        now: the planner's (monotonic) clock.
        wall: the wall clock at ``now`` (attempt starts are daemons' wall-clock times).
        graceful: the jobs whose slots drain (graceful preemption); an immediate job's slot is
            free at once (its task is interrupted), so it has no ends.
        graces: the graceful jobs whose drains are bounded (``preemption_grace`` seconds): a
            slot taken now frees by then at the latest.
    """

    def __init__(
        self,
        sessions: Sequence[Reporting],
        now: float,
        wall: float,
        graceful: Container[str],
        graces: Mapping[str, float] | None = None,
    ) -> None:
        self._graceful = graceful
        self._graces = graces or {}
        self._sessions = {s.daemon_id: s for s in sessions}
        self._now = now
        self._wall = wall
        self._read: dict[str, dict[str, list[float]]] = {}

    def _daemon(self, daemon_id: str) -> dict[str, list[float]]:
        found = self._read.get(daemon_id)
        if found is None:
            found = self._read[daemon_id] = self._estimate(self._sessions[daemon_id])
        return found

    def _estimate(self, session: Reporting) -> dict[str, list[float]]:
        running = session.running
        if not running.attempts and not running.left_out:
            return {}  # an idle daemon (or one whose tasks are not reported): no ends
        means = {s.job_id: s.service_time for s in session.stats}
        starts: dict[str, list[float]] = {}
        for attempt in session.running.attempts:
            if attempt.job_id not in self._graceful:
                continue
            starts.setdefault(attempt.job_id, []).append(attempt.start - self._wall + self._now)
        for job_id, count in session.running.left_out.items():
            if job_id not in self._graceful:
                continue
            # Not listed: the newest attempts (the oldest are); they started by the last report.
            starts.setdefault(job_id, []).extend([min(session.last_seen, self._now)] * count)
        ends = {job: expected_ends(s, means.get(job, 0.0), self._now) for job, s in starts.items()}
        for job, grace in self._graces.items():
            if job in ends:
                ends[job] = [min(end, self._now + grace) for end in ends[job]]
        return ends

    def __getitem__(self, key: tuple[str, str]) -> Sequence[float]:
        daemon_id, job_id = key
        if daemon_id not in self._sessions:
            raise KeyError(key)
        ends = self._daemon(daemon_id).get(job_id)
        if ends is None:
            raise KeyError(key)
        return ends

    @overload
    def get(self, key: tuple[str, str], /) -> Sequence[float] | None: ...
    @overload
    def get(self, key: tuple[str, str], default: Sequence[float] | T, /) -> Sequence[float] | T: ...
    def get(self, key: tuple[str, str], default: object = None, /) -> object:
        """As :meth:`__getitem__`, without raising for a pair with no ends (most pairs, on a
        cluster of idle daemons: the planner asks for every move's donor)."""
        daemon_id, job_id = key
        session = self._sessions.get(daemon_id)
        if session is None:
            return default
        running = session.running
        if not running.attempts and not running.left_out:
            return default  # nothing reported running there: no ends (as _estimate finds)
        ends = self._daemon(daemon_id).get(job_id)
        return default if ends is None else ends

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for daemon_id in self._sessions:
            for job_id in self._daemon(daemon_id):
                yield daemon_id, job_id

    def __len__(self) -> int:
        return sum(len(self._daemon(d)) for d in self._sessions)
