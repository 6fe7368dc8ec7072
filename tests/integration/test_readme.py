"""The README's first screen: its two commands exist, and the first one works."""

from __future__ import annotations

import os
import subprocess
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
