"""Ctrl-C in a blocking call: the call on the loop thread is cancelled and has unwound before
KeyboardInterrupt reaches the caller; the job is left running, resumable, and the SDK says so."""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path

import pytest

from tests.unit.client.fakes import FakeScheduler, client_for
from truba.client.blocking import BlockingJob, _LoopThread
from truba.client.interrupt import run_on
from truba.pipes.fake_broker import FakeBroker
from truba.proto.v1 import jobs_pb2


def interrupt_soon(delay: float = 0.2) -> threading.Timer:
    """Sends SIGINT to the main thread after ``delay`` seconds, as Ctrl-C does."""
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(delay, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    return timer


def test_an_interrupted_call_is_cancelled_and_unwound_before_the_interrupt_goes_on() -> None:
    runner = _LoopThread()
    unwound: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            unwound.append("unwound")

    try:
        interrupt_soon()
        with pytest.raises(KeyboardInterrupt):
            run_on(runner.loop, forever())
        assert unwound == ["unwound"]
    finally:
        runner.stop()


def test_ctrl_c_in_a_blocking_results_loop_leaves_the_job_running_and_resumable(tmp_path: Path) -> None:
    scheduler = FakeScheduler([FakeBroker("fake://b0")])
    runner = _LoopThread()
    try:
        client = client_for(scheduler, journal=tmp_path)
        runner.run(client.connect())
        job = BlockingJob(runner.run(client.create_job("h:f")), runner)
        job.submit(1)
        job.close()
        interrupt_soon()  # no daemon answers: results() waits
        with pytest.raises(KeyboardInterrupt):
            for _ in job.results():
                pass
        assert job._job.ended and (tmp_path / job.id).is_dir()
        assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CLOSED  # still in the cluster
        resumed = runner.run(client.resume(job.id))
        assert resumed.outstanding == 1
        runner.run(client.close())
    finally:
        runner.stop()


def test_a_blocking_job_used_as_a_context_manager_is_cancelled_when_the_block_raises(tmp_path: Path) -> None:
    scheduler = FakeScheduler([FakeBroker("fake://b0")])
    runner = _LoopThread()
    try:
        client = client_for(scheduler, journal=tmp_path)
        runner.run(client.connect())
        with (
            pytest.raises(ZeroDivisionError),
            BlockingJob(runner.run(client.create_job("h:f")), runner) as job,
        ):
            job.submit(1)
            _ = 1 / 0
        assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CANCELLED
        assert not (tmp_path / job.id).exists()
        runner.run(client.close())
    finally:
        runner.stop()
