"""The SDK under a user's hand: Ctrl-C ends a blocking call at once and leaves the job running and
resumable; a cluster that goes away ends the client's waits with Unavailable within its bound,
with one line to stderr and no traceback; an unreachable scheduler likewise."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.integration.processes import running
from truba.client import Client, Unavailable
from truba.proto.v1 import jobs_pb2

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("interrupt_client_proc.py")


async def start(mode: str, address: str, journal: Path) -> tuple[asyncio.subprocess.Process, str]:
    """The client process, once its job exists and it took its first outcome; and the job's id."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), mode, address, str(journal),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert child.stdout is not None and child.stderr is not None
    job_id = ""
    async with asyncio.timeout(60):
        while True:
            line = (await child.stdout.readline()).decode().strip()
            assert line, f"the client exited early: {(await child.stderr.read()).decode()}"
            if line.startswith("job "):
                job_id = line.split()[1]
            elif line == "outcome":
                return child, job_id


async def test_ctrl_c_during_a_blocking_map_raises_keyboard_interrupt_and_leaves_the_job_resumable(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=1, slots=2) as cluster:
        child, job_id = await start("map", cluster.address, journal)
        await asyncio.sleep(0.3)  # mid-map: most likely waiting for the next outcome
        child.send_signal(signal.SIGINT)
        async with asyncio.timeout(2.0):  # the bound the user is promised
            _, err = await child.communicate()
        stderr = err.decode()
        assert child.returncode != 0
        assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
        assert "RuntimeError" not in stderr and "aclose" not in stderr, stderr
        assert stderr.count("Traceback") == 1, stderr  # the interrupt's own, nothing else
        told = [line for line in stderr.splitlines() if "keeps running" in line]
        assert told == [
            f"truba: job {job_id} keeps running; resume it with client.resume('{job_id}') "
            f"or cancel it with client.job('{job_id}').cancel()"
        ]
        async with Client(cluster.address, journal=journal) as client:
            live = (jobs_pb2.JOB_STATE_OPEN, jobs_pb2.JOB_STATE_CLOSED)
            assert (await client.job(job_id).info()).state in live  # still running in the cluster
            job = await client.resume(job_id)  # resumable: its journal was left for it
            assert 0 < job.submitted and job.received < job.submitted
            await job.cancel()


async def test_a_client_whose_brokers_are_stopped_gets_unavailable_within_its_bound_and_no_traceback(
    fresh_nodes: object, tmp_path: Path
) -> None:
    brokers = fresh_nodes(1)  # type: ignore[operator]
    async with running(tmp_path / "cluster", brokers, daemons=1, slots=1) as cluster:
        child, _ = await start("outage", cluster.address, tmp_path / "journal")
        await asyncio.to_thread(brokers[0].stop)
        async with asyncio.timeout(60):
            out, err = await child.communicate()
        stderr = err.decode()
        assert child.returncode == 0, stderr
        said = out.decode().split()
        assert "unavailable" in said, out.decode() + stderr
        assert float(said[said.index("unavailable") + 1]) < 30  # its bound is 3 s: bounded, not forever
        assert "Traceback" not in stderr and "aiormq" not in stderr, stderr
        assert stderr.count("no broker is reachable") == 1, stderr
        await asyncio.to_thread(brokers[0].restart)


async def test_a_client_whose_scheduler_is_unreachable_gets_unavailable_within_its_bound(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    began = time.monotonic()
    async with Client(f"127.0.0.1:{port}", journal=False, unavailable_after=1.0) as client:
        with pytest.raises(Unavailable, match="did not answer within 1 s"):
            await client.create_job("tests.handlers.basic:echo")
    assert time.monotonic() - began < 30  # bounded, not forever
    assert "Traceback" not in capfd.readouterr().err
