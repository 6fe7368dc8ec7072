"""Task counters from client and daemon reports, and the demand they imply."""

from __future__ import annotations

import random

from truba.scheduler.counters import DaemonJobStats, JobCounters, _JobCounters, stored_counts


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


def test_a_finished_job_shows_every_task_done_and_no_backlog_even_without_daemon_reports() -> None:
    # Given a job of 200 tasks that finished before any daemon heartbeat reached the scheduler
    # (`truba jobs` used to show DONE 0 BACKLOG 200 for it forever)
    counters = JobCounters()
    counters.client_report("j", submitted=200, received=150, now=0.0)
    counts = counters.shown("j", 200, ended=True, all_outcomes=True)
    assert (counts.submitted, counts.done, counts.failed, counts.running, counts.backlog) == (
        200,
        200,
        0,
        0,
        0,
    )


def test_a_recovered_job_counts_each_task_once_not_every_run() -> None:
    # Given 40 tasks the daemons ran 84 times (a resumed client sent them again), 2 of them failed
    counters = JobCounters()
    counters.client_report("j", submitted=40, received=10, now=0.0)
    counters.daemon_report("d1", [DaemonJobStats("j", done=82, failed=2, busy=2)])
    running = counters.shown("j", 40)
    assert (running.done, running.failed, running.running, running.backlog) == (38, 2, 0, 0)
    finished = counters.shown("j", 40, ended=True, all_outcomes=True)
    assert (finished.done, finished.failed, finished.running, finished.backlog) == (38, 2, 0, 0)


def test_a_job_whose_client_took_every_outcome_shows_no_backlog_before_the_daemons_report() -> None:
    # Given the client has every outcome and the daemons' last heartbeat is older than that
    counters = JobCounters()
    counters.daemon_report("d1", [DaemonJobStats("j", done=30, busy=4)])
    counters.client_report("j", submitted=50, received=50, now=0.0)
    counts = counters.shown("j", 50)
    assert (counts.done, counts.running, counts.backlog) == (50, 0, 0)
    # The raw sums that feed demand are unchanged
    assert counters.counts("j", 50).done == 30


def test_a_cancelled_job_runs_nothing_and_has_no_backlog() -> None:
    counters = JobCounters()
    counters.daemon_report("d1", [DaemonJobStats("j", done=5, busy=2)])
    counts = counters.shown("j", 20, ended=True)
    assert (counts.submitted, counts.done, counts.running, counts.backlog) == (20, 5, 0, 0)


def test_delayed_tasks_are_no_demand_for_slots_until_they_are_due() -> None:
    counters = JobCounters()
    counters.client_report("j", submitted=100, received=0, now=1.0, delayed=100)
    assert counters.demand("j", now=1.0) == 0  # all delayed: no slot, not even one to probe with
    assert counters.client_report("j", submitted=100, received=0, now=2.0, delayed=70)  # 30 fell due
    assert counters.demand("j", now=2.0) == 30
    counters.daemon_report("d1", [DaemonJobStats("j", done=30)])
    counters.client_report("j", submitted=100, received=30, now=3.0, delayed=70)
    assert counters.demand("j", now=3.0) == 0
    # A client silent past CLIENT_FRESH: its delayed count is no longer trusted, the tasks are.
    assert counters.demand("j", now=30.0) == 70


def test_the_sums_kept_as_reports_come_equal_the_rows_added_up() -> None:
    """Counts no longer add up every daemon's row per view; the sums kept per report must be the
    same numbers through reports, daemon restarts (counts going down), losses and a restore."""
    rng = random.Random(7)
    counters = JobCounters()
    counters.client_report("j", submitted=10_000, received=0, now=1.0)
    last: dict[str, tuple[int, int]] = {}
    for _ in range(2_000):
        daemon = f"d{rng.randrange(20)}"
        if rng.random() < 0.05:
            counters.daemon_lost(daemon)
            continue
        done, failed = last.get(daemon, (0, 0))
        if rng.random() < 0.05:
            done, failed = 0, 0  # restarted
        done, failed = done + rng.randrange(3), failed + rng.randrange(2)
        last[daemon] = (done, failed)
        stats = DaemonJobStats(
            "j",
            done=done,
            failed=failed,
            busy=rng.randrange(4),
            waiting=rng.randrange(3),
            service_time=rng.choice([0.0, 0.5, 1.25]),
        )
        counters.daemon_report(daemon, [stats])
        job = counters._jobs["j"]
        rows = job.daemons.values()
        want = (
            job.retired_done + sum(r.done for r in rows),
            job.retired_failed + sum(r.failed for r in rows),
            sum(r.busy for r in rows),
        )
        times = [r.service_time for r in rows if r.service_time > 0]
        counts = counters.counts("j")
        assert (counts.done, counts.failed, counts.running) == want
        assert job.waiting == sum(r.waiting for r in rows)
        assert counts.service_time == (sum(times) / len(times) if times else 0.0)
    restored = _JobCounters.from_json(counters._jobs["j"].to_json())
    assert (restored.done, restored.failed) == (
        sum(r.done for r in restored.daemons.values()),
        sum(r.failed for r in restored.daemons.values()),
    )
