"""A daemon's Prometheus metrics: what it runs, how attempts end, its slots, brokers and scheduler.

One registry per daemon (never the process-wide default: several daemons in one process, as in
tests, do not mix), served by ``truba daemon --metrics HOST:PORT``
(:mod:`truba.daemon.metrics_http`). Two kinds:

- **Instruments** updated as things happen, through :class:`JobMeter` (one per job's runner,
  called by :class:`truba.daemon.task_events.TaskEvents`): attempt durations
  (``truba_daemon_attempt_duration_seconds``) and attempts by outcome, per job; slot restarts
  (after an attempt that ended without a reply) and recycles (after ``max_tasks`` tasks or over
  the soft memory limit), by reason.
- **State** read at each scrape (:class:`DaemonState`): slots and busy slots, the scheduler
  link's connects and heartbeats, and per broker the connections opened and publisher confirms
  counted by :mod:`truba.daemon.broker_meter` (plain integers on the hot path, no lock).

Label cardinality is bounded: jobs are labelled by id while they run here (a job's series go
when it leaves the daemon: :meth:`DaemonMetrics.forget`), brokers by their redacted URL (the
scheduler's list), reasons and outcomes by fixed words; never by task.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Protocol, final

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from truba.pipes.broker import redact

ATTEMPT_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
"""Seconds: from no-op tasks (a millisecond) to hour-long ones."""

OUTCOMES: Final = (
    "ok",
    "failed",
    "retried",
    "timeout",
    "crashed",
    "out_of_memory",
    "preempted",
    "given_up",
)
"""How an attempt ended: a result (``ok``), a handler error as the outcome (``failed``) or
retried (``retried``, ``retry_on``), the timeout, the slot's death, the hard memory limit,
an interrupt (``preempted``: back unspent). ``given_up`` counts tasks given up here (their last
attempt also counted by how it ended, or spent elsewhere before this daemon admitted them)."""

SLOT_RESTARTS: Final = ("crashed", "timeout", "out_of_memory", "interrupted")
SLOT_RECYCLES: Final = ("max_tasks", "soft_memory")


class LinkCounts(Protocol):
    """What the scrape reads from the scheduler link (:class:`truba.daemon.control.SchedulerLink`)."""

    @property
    def connects(self) -> int: ...

    @property
    def heartbeats(self) -> int: ...

    @property
    def is_connected(self) -> bool: ...

    @property
    def epoch(self) -> int: ...

    @property
    def stale_assignments(self) -> int: ...


class DaemonState(Protocol):
    """What the scrape reads from the daemon (:class:`truba.daemon.daemon.Daemon`)."""

    @property
    def link(self) -> LinkCounts: ...

    def slot_use(self) -> tuple[int, int]:
        """``(slots, busy slots)`` now."""
        ...


@dataclass
class BrokerTally:
    """Counts for one broker, bumped without a lock (the event loop's thread only)."""

    connects: int = 0
    confirmed: int = 0
    unconfirmed: int = 0


@final
class _JobTally:
    """One job's attempts on this daemon as plain numbers (the event loop's thread only), read
    at scrape time: a prometheus_client histogram sample and counter cost an attempt ~2.8 µs
    (locks, one per value), these ~0.5 µs."""

    __slots__ = ("buckets", "seconds", "outcomes")

    def __init__(self) -> None:
        self.buckets = [0] * (len(ATTEMPT_BUCKETS) + 1)
        """Attempts by the first bucket whose bound they are within (the last: over them all)."""
        self.seconds = 0.0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)


@final
class JobMeter:
    """One job's instruments on this daemon."""

    def __init__(self, metrics: DaemonMetrics, tally: _JobTally) -> None:
        self._metrics = metrics
        self._tally = tally

    def ended(self, outcome: str, seconds: float) -> None:
        """An attempt ended ``outcome`` (one of :data:`OUTCOMES`) after ``seconds`` on its slot."""
        tally = self._tally
        tally.buckets[bisect.bisect_left(ATTEMPT_BUCKETS, seconds)] += 1
        tally.seconds += seconds
        tally.outcomes[outcome] += 1

    def gave_up(self) -> None:
        """A task was given up (its attempts all spent)."""
        self._tally.outcomes["given_up"] += 1

    def slot_restarted(self, reason: str) -> None:
        """A slot was (killed and) started afresh after an attempt: one of :data:`SLOT_RESTARTS`."""
        self._metrics.slot_restarts.labels(reason).inc()

    def slot_recycled(self, reason: str) -> None:
        """A slot was replaced after a good attempt: one of :data:`SLOT_RECYCLES`."""
        self._metrics.slot_recycles.labels(reason).inc()


@final
class DaemonMetrics:
    """A daemon's registry, the instruments its runners update and the brokers' tallies."""

    def __init__(self, daemon_id: str) -> None:
        self.daemon_id = daemon_id
        self.registry = CollectorRegistry(auto_describe=True)
        self.slot_restarts = Counter(
            "truba_daemon_slot_restarts",
            "Slot processes started afresh after an attempt that ended without a reply, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.slot_recycles = Counter(
            "truba_daemon_slot_recycles",
            "Slot processes replaced after max_tasks tasks or over the soft memory limit, by reason.",
            ["reason"],
            registry=self.registry,
        )
        for reason in SLOT_RESTARTS:
            self.slot_restarts.labels(reason)
        for reason in SLOT_RECYCLES:
            self.slot_recycles.labels(reason)
        self.brokers: dict[str, BrokerTally] = {}
        """Tallies by broker URL (redacted when exported)."""
        self._jobs: dict[str, _JobTally] = {}
        self._state: DaemonState | None = None
        self.registry.register(_JobsCollector(self._jobs))

    def job(self, job_id: str) -> JobMeter:
        """The instruments of ``job_id`` (its series exist from now until :meth:`forget`; the
        job's runners on this daemon share them)."""
        tally = self._jobs.get(job_id)
        if tally is None:
            tally = self._jobs[job_id] = _JobTally()
        return JobMeter(self, tally)

    def forget(self, job_id: str) -> None:
        """Drops the job's series: it left this daemon (they start from zero if it comes back)."""
        self._jobs.pop(job_id, None)

    @property
    def jobs(self) -> frozenset[str]:
        """Jobs with series now."""
        return frozenset(self._jobs)

    def broker(self, url: str) -> BrokerTally:
        """The tally of the broker at ``url`` (made on first use)."""
        tally = self.brokers.get(url)
        if tally is None:
            tally = self.brokers[url] = BrokerTally()
        return tally

    def broker_connected(self, url: str) -> None:
        """A connection to the broker at ``url`` opened (the first one, or a reconnect)."""
        self.broker(url).connects += 1

    def watch(self, state: DaemonState) -> None:
        """Reads slots, the scheduler link and the brokers' tallies from ``state`` at every scrape."""
        if self._state is not None:
            raise RuntimeError("DaemonMetrics already watches a daemon")
        self._state = state
        self.registry.register(_StateCollector(self, state))


@final
class _JobsCollector(Collector):
    """Each job's attempts (its :class:`_JobTally`) as they are at scrape time."""

    def __init__(self, jobs: dict[str, _JobTally]) -> None:
        self._jobs = jobs

    def collect(self) -> Iterable[Metric]:
        durations = HistogramMetricFamily(
            "truba_daemon_attempt_duration_seconds",
            "Seconds an attempt held its slot (every ending), per job.",
            labels=["job_id"],
        )
        attempts = CounterMetricFamily(
            "truba_daemon_attempts",
            "Attempts by how they ended, per job (given_up: tasks given up here).",
            labels=["job_id", "outcome"],
        )
        for job_id, tally in list(self._jobs.items()):
            running, buckets = 0, []
            for bound, count in zip((*ATTEMPT_BUCKETS, math.inf), tally.buckets, strict=True):
                running += count
                buckets.append(("+Inf" if bound == math.inf else repr(bound), running))
            durations.add_metric([job_id], buckets, tally.seconds)
            for outcome, count in tally.outcomes.items():
                attempts.add_metric([job_id, outcome], count)
        return [durations, attempts]


@final
class _StateCollector(Collector):
    """The daemon as it is at scrape time."""

    def __init__(self, metrics: DaemonMetrics, state: DaemonState) -> None:
        self._metrics = metrics
        self._state = state

    def collect(self) -> Iterable[Metric]:
        return list(_families(self._metrics, self._state))


def _families(metrics: DaemonMetrics, state: DaemonState) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "truba_daemon_info", "This daemon (always 1), its id as a label.", labels=["daemon"]
    )
    info.add_metric([metrics.daemon_id], 1)
    slots, busy = state.slot_use()
    yield info
    yield GaugeMetricFamily("truba_daemon_slot_processes", "Slot processes of this daemon.", value=slots)
    yield GaugeMetricFamily(
        "truba_daemon_busy_slot_processes", "Slot processes running a task now.", value=busy
    )
    link = state.link
    yield GaugeMetricFamily(
        "truba_daemon_scheduler_connected",
        "1 while the Connect stream to the scheduler is up (welcomed), else 0.",
        value=1 if link.is_connected else 0,
    )
    yield CounterMetricFamily(
        "truba_daemon_scheduler_connects",
        "Connect streams the scheduler welcomed (the first one included: more means reconnects).",
        value=link.connects,
    )
    yield CounterMetricFamily(
        "truba_daemon_heartbeats", "Heartbeats sent to the scheduler.", value=link.heartbeats
    )
    yield GaugeMetricFamily(
        "truba_daemon_scheduler_epoch",
        "The highest leader epoch seen from a scheduler (it grows at each change of leader).",
        value=link.epoch,
    )
    yield CounterMetricFamily(
        "truba_daemon_stale_assignments",
        "Assignments ignored for an epoch older than the highest seen (a former leader's).",
        value=link.stale_assignments,
    )
    connects = CounterMetricFamily(
        "truba_daemon_broker_connects",
        "Connections opened to the broker (the first one included: more means reconnects).",
        labels=["broker"],
    )
    confirms = CounterMetricFamily(
        "truba_daemon_broker_confirms",
        "Publisher confirms of messages this daemon sent (results, requeues, hand-back records, dead"
        " letters; a frame counts once), by result: ok, or failed (refused, timed out, connection lost).",
        labels=["broker", "result"],
    )
    for url, tally in metrics.brokers.items():
        broker = redact(url)
        connects.add_metric([broker], tally.connects)
        confirms.add_metric([broker, "ok"], tally.confirmed)
        confirms.add_metric([broker, "failed"], tally.unconfirmed)
    yield connects
    yield confirms
