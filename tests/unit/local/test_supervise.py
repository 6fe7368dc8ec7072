"""`truba up` supervises its processes: a dead one is reaped (no zombie), reported on one line
and restarted with a growing delay; its log gets a marker line at each start."""

from __future__ import annotations

import time
from pathlib import Path

from truba.local.cluster import LocalCluster
from truba.local.supervise import Supervisor, exit_reason


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def test_a_dead_daemon_is_reaped_reported_once_and_restarted_with_backoff(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    said: list[str] = []
    clock = Clock()
    supervisor = Supervisor(cluster, said.append, clock=clock)
    try:
        first = cluster.spawn("daemon-0", ["no-such-verb"])  # exits at once with 2, as a crash would
        first.popen.wait(30)
        supervisor.check()
        assert not Path(f"/proc/{first.pid}").exists()  # reaped: no zombie left
        assert said == [
            f"daemon-0 (pid {first.pid}) exited with 2; restarting it in 1 s (log: {first.log_path})"
        ]
        clock.now += 0.5
        supervisor.check()
        assert cluster.processes == [first] and len(said) == 1  # not yet, and said once
        clock.now += 0.6
        supervisor.check()
        [second] = cluster.processes
        assert second is not first and second.name == "daemon-0"
        second.popen.wait(30)
        supervisor.check()
        assert said[-1].endswith(f"restarting it in 2 s (log: {second.log_path})")  # it died again soon
    finally:
        cluster.stop()
    markers = [line for line in first.log_path.read_text().splitlines() if line.startswith("--- truba: ")]
    assert [m.split()[3] for m in markers] == ["started", "restarted"]


def test_a_daemon_that_exits_cleanly_after_a_drain_is_not_restarted(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    said: list[str] = []
    clock = Clock()
    supervisor = Supervisor(cluster, said.append, clock=clock)
    try:
        drained = cluster.spawn("daemon-1", ["--version"])  # exits with 0, as a drained daemon does
        drained.popen.wait(30)
        supervisor.check()
        clock.now += 60
        supervisor.check()
    finally:
        cluster.stop()
    assert cluster.processes == []
    assert said == [f"daemon-1 (pid {drained.pid}) exited with 0 (drained or stopped); not restarting it"]


def test_each_run_starts_a_fresh_log_and_keeps_the_previous_one(tmp_path: Path) -> None:
    for _ in range(2):
        cluster = LocalCluster(tmp_path)
        cluster.spawn("scheduler", ["--version"]).popen.wait(30)
        cluster.stop()
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["scheduler.log", "scheduler.log.1"]
    assert (logs / "scheduler.log").read_text().startswith("--- truba: scheduler started at ")


def test_exit_reasons_are_words() -> None:
    assert exit_reason(3) == "exited with 3"
    assert exit_reason(-9) == "killed by SIGKILL"
