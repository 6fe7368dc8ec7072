"""Task counters from client and daemon reports, and the demand they imply."""

from __future__ import annotations

from truba.scheduler.counters import DaemonJobStats, JobCounters, stored_counts


def test_demand_is_unknown_until_a_client_reports_and_outstanding_after() -> None:
    counters = JobCounters()
    assert counters.demand("j") is None
    counters.client_report("j", submitted=10, received=0, now=1.0)
    assert counters.demand("j") == 10
    counters.daemon_report("d1", [DaemonJobStats("j", done=3, failed=1, busy=2)])
    assert counters.demand("j") == 6
    counts = counters.counts("j")
    assert (counts.submitted, counts.done, counts.failed, counts.running, counts.backlog) == (10, 3, 1, 2, 4)


def test_a_closed_job_has_known_demand_without_client_reports() -> None:
    counters = JobCounters()
    counters.daemon_report("d1", [DaemonJobStats("j", done=5)])
    assert counters.demand("j", closed_submitted=8) == 3
    assert counters.demand("j", closed_submitted=5) == 0


def test_duplicate_runs_cannot_starve_a_job_while_its_client_reports() -> None:
    counters = JobCounters()
    counters.client_report("j", submitted=100, received=60, now=10.0)
    # 100 runs finished, 40 of them second runs of tasks (a resumed client sent them again):
    # the daemons' count says nothing is left; the client has 40 outcomes still to come.
    counters.daemon_report("d1", [DaemonJobStats("j", done=100)])
    assert counters.demand("j", closed_submitted=100, now=12.0) == 1  # one slot to probe with
    counters.daemon_report("d1", [DaemonJobStats("j", done=101, busy=3, waiting=2)])
    assert counters.demand("j", closed_submitted=100, now=13.0) == 6  # what runs and waits, + 1
    # A client silent for longer than CLIENT_FRESH no longer counts: the daemons' view stands.
    assert counters.demand("j", closed_submitted=100, now=30.0) == 0
    counters.client_report("j", submitted=100, received=100, now=31.0)
    assert counters.demand("j", closed_submitted=100, now=31.0) == 0  # every outcome is in


def test_smaller_client_numbers_are_ignored() -> None:
    counters = JobCounters()
    assert counters.client_report("j", 10, 2, now=1.0)
    assert not counters.client_report("j", 7, 1, now=2.0)
    assert counters.counts("j").submitted == 10


def test_a_daemon_that_restarted_under_the_same_id_loses_no_count() -> None:
    counters = JobCounters()
    counters.client_report("j", 100, 0, now=0.0)
    counters.daemon_report("d1", [DaemonJobStats("j", done=40, failed=2)])
    counters.daemon_report("d2", [DaemonJobStats("j", done=10)])
    # d1 restarts: its counting begins again
    counters.daemon_report("d1", [DaemonJobStats("j", done=5)])
    counts = counters.counts("j")
    assert (counts.done, counts.failed) == (40 + 10 + 5, 2)


def test_a_lost_daemon_keeps_its_done_counts_but_not_its_running_tasks() -> None:
    counters = JobCounters()
    counters.daemon_report("d1", [DaemonJobStats("j", done=4, busy=3, waiting=1)])
    assert counters.daemon_lost("d1") == {"j"}
    counts = counters.counts("j")
    assert (counts.done, counts.running) == (4, 0)
    assert counters.daemon_lost("d1") == set()


def test_counters_round_trip_through_the_store_without_double_counting() -> None:
    counters = JobCounters()
    counters.client_report("j", 50, 10, now=0.0)
    counters.daemon_report("d1", [DaemonJobStats("j", done=20, failed=1)])
    stored = counters.dirty()
    counters.stored(stored)
    assert counters.dirty() == {}
    # A restarted scheduler loads them; the daemon reconnects with the same cumulative numbers
    restarted = JobCounters()
    restarted.restore(stored)
    restarted.daemon_report("d1", [DaemonJobStats("j", done=22, failed=1)])
    counts = restarted.counts("j")
    assert (counts.submitted, counts.done, counts.failed) == (50, 22, 1)
    assert stored_counts(stored["j"], 0).done == 20


def test_littles_law_keeps_slots_for_a_steady_stream_of_an_open_job() -> None:
    counters = JobCounters()
    # 100 tasks a second, each taking 0.5 s on a slot, all finished as fast as they come
    for second in range(1, 31):
        counters.client_report("j", submitted=100 * second, received=0, now=float(second))
        counters.daemon_report("d1", [DaemonJobStats("j", done=100 * second, service_time=0.5)])
    demand = counters.demand("j")
    assert demand is not None and 40 <= demand <= 55
