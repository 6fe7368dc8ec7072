"""``truba timeline`` against a real cluster: a job that had a task fail and a slot preempted
shows both, in the HTML page's data and in a PNG (both saved to ``$TRUBA_ARTIFACTS``), and
``--json`` gives the raw spans."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.processes import running
from truba.client import Client

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ARTIFACTS = Path(os.environ.get("TRUBA_ARTIFACTS", ".artifacts"))


def truba(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``truba ARGS`` as a user runs it, the scheduler named by ``$TRUBA_SCHEDULER``."""
    env = {**os.environ, "TRUBA_SCHEDULER": address}
    return subprocess.run(
        [sys.executable, "-m", "truba", *args], env=env, capture_output=True, text=True, timeout=60
    )


async def outcomes_of(address: str, job_id: str, wanted: set[str]) -> list[dict[str, object]]:
    """The job's spans once every outcome in ``wanted`` is among them (heartbeats bring them)."""
    deadline = time.monotonic() + 15
    while True:
        done = await asyncio.to_thread(truba, address, "timeline", job_id, "--json")
        assert done.returncode == 0, done.stderr
        [timeline] = json.loads(done.stdout)
        spans: list[dict[str, object]] = timeline["spans"]
        if wanted <= {s["outcome"] for s in spans} or time.monotonic() > deadline:
            return spans
        await asyncio.sleep(0.5)


async def test_a_preempted_slot_and_a_failed_task_are_visible_in_the_timeline(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path, rabbit_nodes, daemons=1, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            # Given a job that preempts at once, with a task that fails and long ones on every slot
            low = await client.create_job("tests.handlers.basic:sleep", 1.0, preemption="immediate")
            await low.submit(-1)  # time.sleep(-1) raises ValueError: a failed task
            for _ in range(4):
                await low.submit(3.0)
            await low.close()
            async with asyncio.timeout(30):
                while (await low.info()).counts.running < 2:
                    await asyncio.sleep(0.1)
            # When a more important job takes a slot from it
            high = await client.create_job("tests.handlers.basic:sleep", 3.0)
            for _ in range(2):
                await high.submit(0.3)
            await high.close()
            assert all([o.ok async for o in high.results()])
            low_ok = sorted([o.ok async for o in low.results()])
        assert low_ok == [False, True, True, True, True]
        spans = await outcomes_of(cluster.address, low.id, {"preempted", "error", "slot_taken"})
        # Then its timeline holds the failure and the preemption, each on a daemon's slot
        outcomes = {str(s["outcome"]) for s in spans}
        assert {"ok", "error", "preempted", "slot_taken"} <= outcomes, outcomes
        failed = next(s for s in spans if s["outcome"] == "error")
        assert failed["error"] == "ValueError" and failed["daemon_id"] == "d0"
        # And both are in the HTML page drawn from it, and in a PNG
        page_path, picture = tmp_path / "low.html", tmp_path / "low.png"
        drawn = await asyncio.to_thread(truba, cluster.address, "timeline", low.id, "-o", str(page_path))
        assert drawn.returncode == 0 and drawn.stdout.startswith(str(page_path)), drawn.stderr
        page = page_path.read_text()
        found = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page, re.S)
        assert found is not None
        marked = {(s["outcome"], s["task_id"]) for s in json.loads(found.group(1))}
        assert ("error", failed["task_id"]) in marked
        assert any(outcome == "preempted" for outcome, _ in marked)
        drawn = await asyncio.to_thread(truba, cluster.address, "timeline", low.id, "-o", str(picture))
        assert drawn.returncode == 0, drawn.stderr
        assert picture.read_bytes().startswith(PNG_MAGIC) and picture.stat().st_size > 10_000
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(picture, ARTIFACTS / "timeline-preempted.png")
        shutil.copy(page_path, ARTIFACTS / "timeline-preempted.html")
        # Without -o or --json: attempts per lane by outcome
        table = await asyncio.to_thread(truba, cluster.address, "timeline", low.id)
        header, *rows = table.stdout.splitlines()
        assert header.split()[:4] == ["DAEMON", "SLOT", "OK", "ERROR"] and len(rows) == 2, table.stdout
        # Several jobs are drawn together, told apart by colour
        both = tmp_path / "both.png"
        drawn = await asyncio.to_thread(truba, cluster.address, "timeline", low.id, high.id, "-o", str(both))
        assert drawn.returncode == 0 and both.read_bytes().startswith(PNG_MAGIC), drawn.stderr
        # An unknown job is one line and a failure
        missing = await asyncio.to_thread(truba, cluster.address, "timeline", "nope", "--json")
        assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "NOT_FOUND" in missing.stderr
