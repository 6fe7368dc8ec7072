"""A job's outcome latency on the scheduler: the client's cumulative counts kept across its
restarts, shown as p50/p99 and exported as a Prometheus histogram that promtool accepts."""

from __future__ import annotations

import math
import os
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.scheduler.conftest import Scheduled
from truba.latency import BOUNDS, BUCKETS, LatencyCounts
from truba.scheduler.metrics import SchedulerMetrics
from truba.scheduler.outcome_latency import OutcomeLatencies
from truba.scheduler.view import ClusterView

HANDLER = "examples.math:square"
FAMILY = "truba_job_outcome_latency_seconds"


def counts_of(*seconds: float) -> LatencyCounts:
    counts = LatencyCounts()
    for s in seconds:
        counts.observe(s)
    return counts


def test_a_clients_counts_replace_its_last_and_a_new_client_adds_to_them() -> None:
    latencies = OutcomeLatencies()
    assert latencies.of("j1") is None
    first = counts_of(0.1, 0.1)
    assert latencies.report("j1", first.counts, first.sum)
    more = counts_of(0.1, 0.1, 2.0)
    assert latencies.report("j1", more.counts, more.sum)
    assert not latencies.report("j1", more.counts, more.sum)  # a keepalive: nothing new
    assert latencies.of("j1") == more
    # the client was resumed in a new process: it counts from zero, the job's total goes on
    restarted = counts_of(30.0)
    assert latencies.report("j1", restarted.counts, restarted.sum)
    assert latencies.of("j1") == more + restarted
    later = counts_of(30.0, 0.1)
    latencies.report("j1", later.counts, later.sum)
    assert latencies.of("j1") == more + later
    latencies.forget("j1")
    assert latencies.of("j1") is None


def test_counts_of_other_buckets_or_a_bad_sum_are_ignored() -> None:
    latencies = OutcomeLatencies()
    assert not latencies.report("j1", [1, 2, 3], 1.0)
    assert not latencies.report("j1", [1] * BUCKETS, math.nan)
    assert not latencies.report("j1", [1] * BUCKETS, -1.0)
    assert latencies.of("j1") is None


def scrape(view: ClusterView) -> str:
    metrics = SchedulerMetrics()
    metrics.watch(view)
    return generate_latest(metrics.registry).decode()


def samples(text: str, job_id: str) -> dict[str, float]:
    """The job's latency samples by name (a bucket's name ends with its le)."""
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name == FAMILY:
            for sample in family.samples:
                if sample.labels["job_id"] == job_id:
                    le = sample.labels.get("le")
                    found[sample.name + (f"@{le}" if le else "")] = sample.value
    return found


async def test_reported_latency_is_shown_as_p50_p99_and_exported_as_a_histogram(
    scheduled: Scheduled,
) -> None:
    jobs, view = scheduled.jobs, scheduled.view
    job = await jobs.create(HANDLER, 1.0)
    idle = await jobs.create(HANDLER, 1.0)
    reported = counts_of(*([0.02] * 98), 3.0, 4000.0)
    jobs.report_progress(job.id, 100, 100, latency=(reported.counts, reported.sum))
    jobs.report_progress(idle.id, 0, 0)  # an older client: no latency
    shown = view.job(job.id).counts
    assert 0.01 < shown.outcome_latency_p50 <= 0.025
    assert 2.5 < shown.outcome_latency_p99 <= 5.0
    assert view.job(idle.id).counts.outcome_latency_p50 == 0.0
    text = scrape(view)
    assert f"# TYPE {FAMILY} histogram" in text
    got = samples(text, job.id)
    assert got[f"{FAMILY}_bucket@0.005"] == 0 and got[f"{FAMILY}_bucket@0.025"] == 98
    assert got[f"{FAMILY}_bucket@5.0"] == 99 and got[f"{FAMILY}_bucket@3600.0"] == 99
    assert got[f"{FAMILY}_bucket@+Inf"] == got[f"{FAMILY}_count"] == 100
    assert got[f"{FAMILY}_sum"] == pytest.approx(reported.sum)
    assert len([name for name in got if "_bucket@" in name]) == len(BOUNDS) + 1
    assert samples(text, idle.id)[f"{FAMILY}_count"] == 0  # every runnable job has its series
    check_with_promtool(text)
    # an ended job's series go with it
    await jobs.cancel(job.id)
    assert samples(scrape(view), job.id) == {}


def check_with_promtool(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/bootstrap installs Debian's prometheus package")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
