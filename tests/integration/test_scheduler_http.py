"""The scheduler's HTTP face on a real cluster: metrics move when tasks run, promtool accepts them,
and the JSON API shows the same job as gRPC."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import cast

import pytest

import truba
from tests.integration.processes import Cluster
from truba.client import Outcome

pytestmark = pytest.mark.integration

HTTP_LINE = re.compile(r"^truba scheduler http on http://(\S+)/$", re.MULTILINE)


@pytest.fixture
def cluster(rabbit_nodes: list[object], tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, rabbit_nodes)
    try:
        running.start()
        yield running
    except BaseException:
        print(running.logs())
        raise
    finally:
        running.local.stop()


def http_base(cluster: Cluster) -> str:
    scheduler = cluster.local.processes[0]
    found = HTTP_LINE.search(scheduler.log())
    assert found, f"the scheduler printed no http line:\n{scheduler.log()[-2000:]}"
    return f"http://{found.group(1)}"


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def sample(text: str, metric: str, **labels: str) -> float:
    """The value of the sample ``metric{labels}`` in a Prometheus text exposition (labels in any order)."""
    for line in text.splitlines():
        if not line.startswith(metric + "{") and not line.startswith(metric + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{key}="{val}"' in head for key, val in labels.items()):
            return float(value)
    raise AssertionError(f"no sample {metric}{labels} in:\n{text}")


def test_metrics_follow_a_job_as_its_tasks_run_and_promtool_accepts_them(cluster: Cluster) -> None:
    base = http_base(cluster)
    with truba.connect(cluster.address) as client:
        job = client.create_job(handler="tests.handlers.basic:square", name="squares")
        before = fetch(f"{base}/metrics")
        assert sample(before, "truba_job_info", job_id=job.id, name="squares", state="open") == 1
        assert sample(before, "truba_job_attempts_total", job_id=job.id, result="ok") == 0
        assert sample(before, "truba_scheduler_daemons") == 2
        assert sample(before, "truba_daemon_slots", daemon="d0") == 2
        for i in range(200):
            job.submit(i)
        # The job stays open (a finished job leaves the metrics): take its 200 outcomes as they come.
        results = cast(Generator[Outcome, None, None], job.results())  # closed before the client
        outcomes = [next(results) for _ in range(200)]
        results.close()
        assert all(o.ok for o in outcomes)
        # Daemons report in heartbeats (every 0.5 s here), the client its progress and outcome
        # latency (every 0.25 s): wait for the counters to catch up. The last outcome is taken
        # only when the next is asked for (here never: it is put back), so 199 have a latency.
        deadline = time.monotonic() + 15
        while True:
            after = fetch(f"{base}/metrics")
            done = sample(after, "truba_job_attempts_total", job_id=job.id, result="ok")
            timed = sample(after, "truba_job_outcome_latency_seconds_count", job_id=job.id)
            if (done >= 200 and timed >= 199) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert done == 200 and timed >= 199
        assert sample(after, "truba_job_outcome_latency_seconds_bucket", job_id=job.id, le="+Inf") == timed
        assert 0 < sample(after, "truba_job_outcome_latency_seconds_sum", job_id=job.id) < timed * 60
        assert sample(after, "truba_job_submitted_tasks_total", job_id=job.id) == 200
        assert sample(after, "truba_job_assigned_slots", job_id=job.id) > 0
        assert sample(after, "truba_scheduler_plan_duration_seconds_count") > 0
        assert sample(after, "truba_scheduler_grpc_calls_total", method="CreateJob", code="OK") == 1
        listed = json.loads(fetch(f"{base}/api/v1/jobs"))["jobs"]
        assert [j["id"] for j in listed] == [job.id]
        counts = json.loads(fetch(f"{base}/api/v1/jobs/{job.id}"))["counts"]
        assert counts["submitted"] == "200"
        assert 0 < counts["outcome_latency_p50"] <= counts["outcome_latency_p99"] < 60
        daemons = json.loads(fetch(f"{base}/api/v1/daemons"))["daemons"]
        assert sorted(d["daemon_id"] for d in daemons) == ["d0", "d1"]
        job.close()
    promtool = shutil.which("promtool")
    if promtool is None and not os.environ.get("CI"):
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    assert promtool is not None, "promtool is missing: scripts/bootstrap installs it"
    checked = subprocess.run([promtool, "check", "metrics"], input=after, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
