"""The README's first screen: its two commands exist, and the first one works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_first_screen_has_the_two_commands() -> None:
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert "\nscripts/demo\n" in first_screen
    assert "\nscripts/test\n" in first_screen
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/test" in ci


@pytest.mark.integration
def test_the_demo_command_runs_the_example_job_on_a_local_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "TRUBA_STATE": str(tmp_path / "state"), "TRUBA_LISTEN": "127.0.0.1:0"}
    done = subprocess.run(
        [str(REPO / "scripts" / "demo"), "--limit", "1000000", "--chunk", "50000"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "primes below 1,000,000: 78,498" in output
    assert "matches the known value" in output
    assert "truba up: stopped" in output
    # Nothing the demo started is left running: its brokers' pids are gone.
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_truba_up_stops_everything_it_started_on_a_signal(tmp_path: Path, signum: signal.Signals) -> None:
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "truba", "up", "--brokers", "1", "--daemons", "1", "--slots", "1"]
    argv += ["--allow", "examples.*", "--listen", "127.0.0.1:0", "--state", str(state)]
    up = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert up.stdout is not None
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = up.stdout.readline()
        lines.append(line)
        if "cluster is up" in line or not line:
            break
    assert any("cluster is up" in line for line in lines), "".join(lines)
    assert any(line.startswith("truba up: scheduler: 127.0.0.1:") for line in lines)
    dashboard = [line for line in lines if line.startswith("truba up: dashboard: http://127.0.0.1:")]
    assert dashboard, "".join(lines)
    with urllib.request.urlopen(dashboard[0].split()[-1], timeout=5) as page:
        assert b"static/dashboard.js" in page.read()
    assert any(line.startswith("truba up: brokers: amqp://") for line in lines)
    started = _descendants(up.pid)
    assert len(started) >= 4, started  # a broker, the scheduler, a daemon and its slot at least
    up.send_signal(signum)
    rest, _ = up.communicate(timeout=60)
    assert up.returncode == 0, rest
    assert "truba up: stopped" in rest
    alive = [pid for pid in started if _alive(pid)]
    assert alive == [], f"left running: {alive}"


def _descendants(root: int) -> list[int]:
    table = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,stat="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for row in table.splitlines():
        pid, ppid, stat = row.split()[:3]
        if not stat.startswith("Z"):
            children.setdefault(int(ppid), []).append(int(pid))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
