"""`truba top` against a real cluster: frames printed to a pipe (text and --json) follow a running
job, and on a terminal (tmux) it draws full screen and q or Ctrl-C leaves the terminal as it was."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.processes import ALLOW
from truba.client import Client
from truba.local.cluster import LocalCluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(rabbit_nodes: list[object], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("top"))
    try:
        local.start_scheduler([n.url for n in rabbit_nodes], "127.0.0.1:0", "--heartbeat-interval", "0.5")  # type: ignore[attr-defined]
        local.start_daemon("d0", 2, ALLOW)
        local.wait_for_daemons(1)
        yield local
    except BaseException:
        print("\n".join(f"--- {p.name}\n{p.log()[-4000:]}" for p in local.processes))
        raise
    finally:
        local.stop()


def top(address: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``truba top`` with its stdout a pipe, as in a script."""
    return subprocess.run(
        [sys.executable, "-m", "truba", "top", "--scheduler", address, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def frames(text: str) -> list[list[str]]:
    """The frames of ``top``'s text output, each a list of lines."""
    found: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("truba top  "):
            found.append([])
        if found and line:
            found[-1].append(line)
    return found


async def test_top_prints_a_frame_per_interval_to_a_pipe_that_follows_a_running_job(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    async with Client(cluster.address, journal=tmp_path / "journal") as client:
        # Given a job that runs for a while on the daemon's two slots
        job = await client.create_job("tests.handlers.basic:sleep", name="sleepers", importance=3)
        for _ in range(200):
            await job.submit(0.1)
        await job.close()
        results = job.results()
        await anext(results)  # it runs
        taking = asyncio.ensure_future(_drain(results))

        # When top prints four frames to a pipe, then four as JSON lines
        shown = await asyncio.to_thread(top, cluster.address, "--count", "4", "--interval", "0.5")
        as_json = await asyncio.to_thread(top, cluster.address, "--json", "--count", "3", "--interval", "0.5")
        await taking

    # Then each frame has the cluster's totals and the job's row; its done count moves and its
    # throughput is a number from the second frame on (two samples make a rate)
    assert shown.returncode == 0, shown.stderr
    printed = frames(shown.stdout)
    assert len(printed) == 4, shown.stdout
    done, rates = [], []
    for frame in printed:
        assert frame[1].startswith("daemons 1  slots 2  busy "), frame
        assert frame[2].split()[:6] == ["ID", "NAME", "STATE", "IMPORTANCE", "SHARE", "HELD"]
        row = next(line.split() for line in frame[3:] if line.startswith(job.id))
        assert row[1:4] == ["sleepers", "closed", "3"], row
        done.append(int(row[8]))
        rates.append(row[10])
    assert rates[0] == "-" and all(float(rate) >= 0 for rate in rates[1:]), rates
    assert as_json.returncode == 0, as_json.stderr
    lines = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(lines) == 3
    assert all(frame["cluster"]["daemons"] == 1 and frame["cluster"]["slots"] == 2 for frame in lines)
    jobs = [next(j for j in frame["jobs"] if j["id"] == job.id) for frame in lines]
    assert jobs[0]["tasks_per_second"] is None and isinstance(jobs[-1]["tasks_per_second"], float)
    assert jobs[-1]["name"] == "sleepers" and jobs[-1]["importance"] == 3
    done += [j["done"] for j in jobs]
    assert done == sorted(done) and done[-1] > done[0], done  # the numbers follow the job


async def _drain(results: object) -> None:
    async for _ in results:  # type: ignore[attr-defined]
        pass


def tmux_path() -> str:
    tmux = shutil.which("tmux")
    if tmux is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is missing: scripts/bootstrap installs it")
        pytest.skip("tmux is not installed (apt-get install tmux)")
    return tmux


def eventually(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("key", ["q", "C-c"], ids=["q", "ctrl-c"])
async def test_top_on_a_terminal_draws_the_jobs_and_quitting_restores_the_terminal(
    cluster: LocalCluster, tmp_path: Path, key: str
) -> None:
    tmux = tmux_path()
    socket = f"truba-top-{os.getpid()}-{key}"

    def run(*argv: str) -> str:
        return subprocess.run([tmux, "-L", socket, *argv], capture_output=True, text=True, timeout=10).stdout

    async with Client(cluster.address, journal=tmp_path / "journal") as client:
        job = await client.create_job("tests.handlers.basic:square", name="watched")
        run("new-session", "-d", "-x", "120", "-y", "30", "bash --norc --noprofile")
        try:
            # Given top running in a terminal, started from a shell that notes the tty's settings
            before, after = tmp_path / "stty.before", tmp_path / "stty.after"
            command = shlex.join([sys.executable, "-m", "truba", "top", "--scheduler", cluster.address])
            shell = f"cd {shlex.quote(str(REPO))}; stty -g > {before}; {command}; echo EXIT=$?"
            run("send-keys", f"{shell}; stty -g > {after}", "Enter")
            # Then it draws full screen: the title, the job's row and the key to quit
            eventually(
                lambda: job.id in (pane := run("capture-pane", "-p")) and "q quits" in pane,
                "top did not draw the job",
            )
            pane = run("capture-pane", "-p")
            assert "truba top  scheduler " in pane and "daemons 1  slots 2  busy " in pane
            assert any(line.startswith(job.id) and "watched" in line for line in pane.splitlines()), pane
            # When the key is pressed, top ends with 0 and the terminal is as it was
            run("send-keys", key)
            eventually(lambda: after.exists() and bool(after.read_text()), "top did not quit")
            pane = run("capture-pane", "-p")
            assert "EXIT=0" in pane and "q quits" not in pane, pane
            assert after.read_text() == before.read_text()
        finally:
            run("kill-server")


def test_top_on_a_terminal_shows_a_scheduler_that_went_away_and_still_quits(tmp_path: Path) -> None:
    tmux = tmux_path()
    socket = f"truba-top-{os.getpid()}-gone"

    def run(*argv: str) -> str:
        return subprocess.run([tmux, "-L", socket, *argv], capture_output=True, text=True, timeout=10).stdout

    # Given a scheduler (without brokers: it still answers ListJobs and ListDaemons) and top on it
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "truba", "scheduler", "--listen", "127.0.0.1:0", "--http", "off"]
        + ["--broker", "amqp://guest:guest@127.0.0.1:1/", "--state", str(tmp_path / "state")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert scheduler.stdout is not None
        address = scheduler.stdout.readline().removeprefix("truba scheduler listening on ").strip()
        run("new-session", "-d", "-x", "120", "-y", "30", "bash --norc --noprofile")
        command = shlex.join([sys.executable, "-m", "truba", "top", "--scheduler", address, "--timeout", "1"])
        # (a terminal curses does not know gets frames printed, as a pipe does)
        run(
            "send-keys",
            f"cd {shlex.quote(str(REPO))}; TERM=nosuchterm {command} --count 1; echo DUMB=$?",
            "Enter",
        )
        eventually(lambda: "DUMB=0" in run("capture-pane", "-p"), "top did not print a frame")
        assert "no jobs" in run("capture-pane", "-p")
        run("send-keys", "clear", "Enter")
        eventually(lambda: "DUMB=0" not in run("capture-pane", "-p"), "the pane did not clear")
        run("send-keys", f"cd {shlex.quote(str(REPO))}; {command}; echo EXIT=$?", "Enter")
        eventually(lambda: "no jobs" in run("capture-pane", "-p"), "top did not draw")
        # When the scheduler stops, top says so at the bottom and keeps running
        scheduler.terminate()
        scheduler.wait(15)
        eventually(
            lambda: f"scheduler {address}: unreachable" in run("capture-pane", "-p"), "top did not say it"
        )
        assert "EXIT=" not in run("capture-pane", "-p")
        # Then q still quits, with 0
        run("send-keys", "q")
        eventually(lambda: "EXIT=0" in run("capture-pane", "-p"), "top did not quit")
    finally:
        run("kill-server")
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait()
