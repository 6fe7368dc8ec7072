"""`truba up` stopped and started again on the same --state: the brokers come back on the same
ports with their data and the scheduler on the same address, so a client waiting on a job
finishes it with every outcome once, re-running at most the tasks that were running."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from truba.client import Client

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TASKS = 16
SLOTS = 2
SECONDS = 0.4


def up(state: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """Starts `truba up` on ``state`` and returns it with its lines up to "cluster is up"."""
    argv = [sys.executable, "-m", "truba", "up", "--brokers", "1", "--daemons", "1", "--slots", str(SLOTS)]
    argv += ["--allow", "tests.handlers.*", "--listen", "127.0.0.1:0", "--state", str(state)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or "cluster is up" not in lines[-1]:
        line = process.stdout.readline()
        if not line:
            process.wait(30)
            pytest.fail("truba up ended before the cluster was up:\n" + "".join(lines))
        lines.append(line)
    return process, lines


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=90)
    assert process.returncode == 0, rest
    return rest


def address_of(lines: list[str]) -> str:
    return next(line.split("scheduler: ")[1].strip() for line in lines if "truba up: scheduler: " in line)


def brokers_of(lines: list[str]) -> str:
    return next(line.split("brokers: ")[1].split()[0] for line in lines if "truba up: brokers: " in line)


async def test_truba_up_restarted_on_its_state_lets_a_waiting_client_finish_with_every_outcome_once(
    tmp_path: Path,
) -> None:
    state, runs = tmp_path / "state", tmp_path / "runs"
    runs.mkdir()
    first, lines = await asyncio.to_thread(up, state)
    address, broker = address_of(lines), brokers_of(lines)
    second: subprocess.Popen[str] | None = None
    seen: collections.Counter[str] = collections.Counter()
    try:
        async with Client(address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.faults:count_runs", importance=1.0)
            for i in range(TASKS):
                await job.submit([str(runs / f"t{i}"), SECONDS])
            await job.close()
            some_in = asyncio.Event()

            async def consume() -> None:
                async for outcome in job.results():
                    assert outcome.ok, outcome.error
                    seen[outcome.task_id] += 1
                    if sum(seen.values()) >= SLOTS:
                        some_in.set()

            consumer = asyncio.create_task(consume())
            await asyncio.wait_for(some_in.wait(), 60)
            # The whole cluster goes away under the waiting client, then comes back on its state
            said = await asyncio.to_thread(stop, first)
            assert "truba up: stopped" in said
            assert len(seen) < TASKS  # the client is still waiting while the cluster is down
            second, lines = await asyncio.to_thread(up, state)
            assert address_of(lines) == address
            assert brokers_of(lines) == broker
            assert any("same ports and data" in line for line in lines), lines
            await asyncio.wait_for(consumer, 90)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                await asyncio.to_thread(stop, process)
    assert len(seen) == TASKS and set(seen.values()) == {1}, seen
    counts = [len((runs / f"t{i}").read_text().split()) for i in range(TASKS)]
    assert all(n >= 1 for n in counts), counts
    # Only a task that was running when the cluster stopped may have run twice
    assert sum(n - 1 for n in counts) <= SLOTS, counts


def read_until(process: subprocess.Popen[str], text: str, timeout: float) -> list[str]:
    """Lines of ``process`` up to one containing ``text``; stops the process if none comes in time."""
    assert process.stdout is not None
    timer = threading.Timer(timeout, process.terminate)
    timer.start()
    lines: list[str] = []
    try:
        while not lines or text not in lines[-1]:
            line = process.stdout.readline()
            if not line:
                pytest.fail(f"no {text!r} from truba up:\n" + "".join(lines))
            lines.append(line)
    finally:
        timer.cancel()
    return lines


def test_truba_up_restarts_a_killed_daemon_and_a_second_up_on_its_state_says_who_holds_it(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    process, lines = up(state)
    try:
        # A second `truba up` (or scripts/demo) on the same state: one clear line, not "scheduler
        # exited with 1; see …/scheduler.log"
        second = subprocess.run(
            [sys.executable, "-m", "truba", "up", "--allow", "x.*", "--state", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert second.stdout == (
            f"truba up: error: a cluster is already up on {state} (truba up, pid {process.pid}); stop it "
            f"with Ctrl-C in its terminal or `kill {process.pid}`, or pass another --state\n"
        )
        # How to reach the node with rabbitmqctl is printed
        assert any("rabbitmqctl -n truba-" in line and "--erlang-cookie" in line for line in lines), lines
        # A daemon killed under it is reaped, reported on one line and restarted
        saved = json.loads((state / "cluster.json").read_text())
        daemon = saved["pids"][-1][0]
        os.kill(daemon, signal.SIGKILL)
        said = read_until(process, "daemon-0", 30)
        assert said[-1] == (
            f"truba up: daemon-0 (pid {daemon}) killed by SIGKILL; restarting it in 1 s "
            f"(log: {state}/logs/daemon-0.log)\n"
        )
        deadline = time.monotonic() + 30
        while "daemon-0 restarted at" not in (state / "logs" / "daemon-0.log").read_text():
            assert time.monotonic() < deadline, "daemon-0 was not restarted"
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{daemon}")  # reaped, no zombie
    finally:
        stop(process)


def test_truba_up_stopped_while_its_command_runs_ends_the_command_and_everything_else(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "truba", "up", "--brokers", "1", "--daemons", "1", "--slots", "1"]
    argv += ["--allow", "x.*", "--listen", "127.0.0.1:0", "--state", str(tmp_path / "state")]
    argv += [
        "--",
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)",
    ]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    read_until(process, "truba up: running: ", 120)
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=90)
    assert process.returncode == 130, rest
    assert rest.endswith("truba up: stopping\ntruba up: stopped\n"), rest
