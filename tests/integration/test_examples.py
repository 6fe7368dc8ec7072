"""The runnable examples of the README run, against a real cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.processes import running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def example(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRUBA_SCHEDULER": address}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=90
    )


async def test_quickstart_async_and_blocking_and_the_resume_example(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=1, slots=2) as cluster:
        for flags in ([], ["--blocking"]):
            done = example(cluster.address, "examples.quickstart", *flags)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "primes below 1,000,000: 78,498" in done.stdout

        journal = tmp_path / "journal"
        resume = ["examples.resume", "--journal", str(journal)]
        crashed = example(cluster.address, *resume, "--crash-after", "300")
        assert crashed.returncode == 1 and "crashing after 300 tasks" in crashed.stdout, crashed.stderr
        job_id = (journal / "last-job").read_text()
        resumed = example(cluster.address, *resume, "--resume", job_id)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "300 tasks were in, 0 outcomes taken" in resumed.stdout
        assert f"job {job_id}: 1000 outcomes; primes below 1,000,000 taken this run: 78,498" in resumed.stdout
