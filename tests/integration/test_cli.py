"""The `truba` verbs as a user runs them: against a real cluster (tables, --json that parses,
job, cancel, drain) and against addresses that do not answer (one line, a non-zero exit, soon)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import running
from truba.cli.exits import FAILURE, UNAVAILABLE, USAGE
from truba.client import Client
from truba.local import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VERBS = [
    ["status"],
    ["jobs"],
    ["job", "j-1"],
    ["job", "j-1", "--dead"],
    ["job", "j-1", "--running"],
    ["cancel", "j-1"],
    ["daemons"],
    ["drain", "d-1"],
    ["schedules"],
    ["schedules", "--runs", "s1"],
    ["schedule", "pause", "s1"],
    ["top"],
]


def truba(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "truba", *argv],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def startup_seconds() -> float:
    """How long `truba --help` takes now: the interpreter and imports, which a loaded machine
    stretches to seconds; the bounds below are on the waits after them."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "truba", "--help"], cwd=REPO, capture_output=True, timeout=30)
    return time.monotonic() - began


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield int(server.getsockname()[1])


@pytest.mark.parametrize("argv", VERBS, ids=lambda argv: "-".join(argv).replace("--", ""))
def test_every_verb_on_a_dead_address_prints_one_line_and_exits_69_within_5_s(argv: list[str]) -> None:
    # `truba jobs` printed a 45-line traceback here; the address comes from $TRUBA_SCHEDULER
    dead = f"127.0.0.1:{free_port()}"
    startup = startup_seconds()
    began = time.monotonic()
    done = truba(*argv, env={"TRUBA_SCHEDULER": dead})
    elapsed = time.monotonic() - began
    assert done.returncode == UNAVAILABLE, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"truba {argv[0]}: scheduler {dead}: unreachable")
    assert elapsed < max(5, startup + 2), (elapsed, startup)


def test_a_port_that_accepts_and_never_answers_gives_up_within_5_s_in_every_verb(silent_port: int) -> None:
    # It used to wait 20 s. The verbs run two at a time (this machine's cores): each spends its
    # 3 s mostly waiting on the socket, so a pair shares the CPU only while starting.
    address = f"127.0.0.1:{silent_port}"
    startup = startup_seconds()

    def timed(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
        began = time.monotonic()
        done = truba(*argv, "--scheduler", address)
        return done, time.monotonic() - began

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(map(" ".join, VERBS), pool.map(timed, VERBS), strict=True))
    wrong = {
        verb: (done.returncode, done.stderr, round(elapsed, 2))
        for verb, (done, elapsed) in runs.items()
        if done.returncode != UNAVAILABLE
        or done.stderr != f"truba {verb.split()[0]}: scheduler {address}: no answer within 3 s\n"
        or elapsed >= max(5, startup + 4)
    }
    assert wrong == {}, f"startup {startup:.2f} s; {wrong}"


async def test_the_verbs_against_a_real_cluster_tell_the_truth_in_tables_and_json(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path, rabbit_nodes, daemons=1, slots=2) as cluster:
        env = {"TRUBA_SCHEDULER": cluster.address}
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            finished = await client.create_job("tests.handlers.basic:square", name="squares")
            for i in range(20):
                await finished.submit(i)
            await finished.close()
            values = {o.value async for o in finished.results()}
            assert values == {i * i for i in range(20)}
            unnamed = await client.create_job("tests.handlers.basic:square")

            # jobs: a NAME column (the name, else the handler); a finished job's counts are final
            table = truba("jobs", "--all", env=env)
            assert table.returncode == 0, table.stderr
            header, *rows = table.stdout.splitlines()
            assert header.split() == [
                "ID", "NAME", "STATE", "IMPORTANCE", "SHARE", "SLOTS", "RUNNING", "DONE", "FAILED", "BACKLOG"
            ]  # fmt: skip
            row = next(r.split() for r in rows if r.startswith(finished.id))
            assert row[1:3] == ["squares", "finished"] and row[6:] == ["0", "20", "0", "0"], row
            assert any(
                r.split()[1] == "tests.handlers.basic:square" for r in rows if r.startswith(unnamed.id)
            )
            listed = {job["id"]: job for job in json.loads(truba("jobs", "--all", "--json", env=env).stdout)}
            counts = listed[finished.id]["counts"]
            assert (counts["submitted"], counts["done"], counts["failed"], counts["backlog"]) == (
                20,
                20,
                0,
                0,
            )
            assert listed[unnamed.id]["state"] == "open"

            # job ID: one job in full
            shown = truba("job", finished.id, env=env)
            assert shown.returncode == 0, shown.stderr
            lines = dict(line.split(None, 1) for line in shown.stdout.splitlines())
            assert lines["state"] == "finished" and lines["name"] == "squares"
            assert lines["counts"].startswith("submitted 20, done 20, failed 0, running 0, backlog 0")
            assert "max_attempts 3" in lines["settings"]
            one = json.loads(truba("job", finished.id, "--json", env=env).stdout)
            assert one["id"] == finished.id and one["settings"]["queue_type"] == "quorum"

            # cancel ID; then a job that is not there and an id that cannot be one
            cancelled = truba("cancel", unnamed.id, env=env)
            assert (cancelled.returncode, cancelled.stdout) == (0, f"job {unnamed.id}: cancelled\n")
            assert json.loads(truba("job", unnamed.id, "--json", env=env).stdout)["state"] == "cancelled"
            missing = truba("job", "nosuchjob0", env=env)
            assert missing.returncode == FAILURE and len(missing.stderr.splitlines()) == 1, missing.stderr
            assert missing.stderr.startswith("truba job: NOT_FOUND: ")
            bad = truba("cancel", "../../etc", env=env)
            assert bad.returncode == USAGE and bad.stderr.startswith("truba cancel: INVALID_ARGUMENT: ")

        # status and daemons, as tables and JSON; drain is daemons --drain
        status = json.loads(truba("status", "--json", env=env).stdout)
        assert (status["status"], status["daemons"], status["slots"]) == ("serving", 1, 2)
        [daemon] = json.loads(truba("daemons", "--json", env=env).stdout)
        assert (daemon["id"], daemon["slots"], daemon["state"]) == ("d0", 2, "up")
        assert truba("daemons", env=env).stdout.splitlines()[1].split()[0] == "d0"
        drained = truba("drain", "d0", "--json", env=env)
        assert drained.returncode == 0, drained.stderr
        assert json.loads(drained.stdout)["state"] == "draining"


async def test_job_dead_lists_given_up_tasks_with_their_error_as_a_table_and_json_and_limit_cuts_it(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path, rabbit_nodes, daemons=1, slots=2) as cluster:
        env = {"TRUBA_SCHEDULER": cluster.address}
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            # Given a job with two tasks that outlive their timeout on their only attempt
            job = await client.create_job("tests.handlers.faults:pid", task_timeout=0.5, max_attempts=1)
            ok_id = await job.submit(0.0)
            dead_ids = {await job.submit(30.0), await job.submit(30.0)}
            await job.close()
            outcomes = {o.task_id: o async for o in job.results()}
            assert outcomes[ok_id].ok and all(outcomes[t].gave_up for t in dead_ids)

        # When its dead letters are listed: a row each with task, reason, attempts, broker, error
        table = truba("job", job.id, "--dead", env=env)
        assert table.returncode == 0, table.stderr
        header, *rest = table.stdout.splitlines()
        assert header.split() == ["TASK", "REASON", "ATTEMPTS", "BROKER", "ERROR"]
        rows = [line.split() for line in rest[:2]]
        assert {row[0] for row in rows} == dead_ids
        for row in rows:
            assert row[1:3] == ["gave_up", "1"] and row[3] in ("b0", "b1") and row[4] == "(d0)"
            assert row[5] == "TaskTimeout:", row
        assert rest[2].startswith("kept until ")  # the job ended: they are kept a while

        # And --json parses with the same records, the error's type and message apart
        listed = json.loads(truba("job", job.id, "--dead", "--json", env=env).stdout)
        assert {d["task_id"] for d in listed["dead_letters"]} == dead_ids
        letter = listed["dead_letters"][0]
        assert (letter["reason"], letter["error_type"], letter["attempts"]) == ("gave_up", "TaskTimeout", 1)
        assert letter["error_message"] and letter["daemon_id"] == "d0" and letter["broker"] in ("b0", "b1")
        assert listed["truncated"] is False and listed["kept_until"].endswith("Z")

        # And --limit 1 shows one and says more are kept
        one = json.loads(truba("job", job.id, "--dead", "--limit", "1", "--json", env=env).stdout)
        assert len(one["dead_letters"]) == 1 and one["truncated"] is True
        cut = truba("job", job.id, "--dead", "--limit", "1", env=env).stdout.splitlines()
        assert len(cut) == 4 and cut[2] == "(more are kept than the 1 shown: --limit up to 1000)", cut

        # And a job without dead letters says so
        async with Client(cluster.address, journal=tmp_path / "journal2") as client:
            clean = await client.create_job("tests.handlers.basic:square")
            none = truba("job", clean.id, "--dead", env=env)
        assert (none.returncode, none.stdout) == (0, f"job {clean.id}: no dead letters\n")


def test_truba_up_runs_its_scheduler_and_daemons_with_the_log_flags_it_was_given(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    # `truba up` had no --log-level or --log-format: its processes always logged JSON at info
    url = rabbit_nodes[0].url  # type: ignore[attr-defined]
    argv = ["up", "--broker", url, "--daemons", "1", "--slots", "1", "--allow", "tests.handlers.*"]
    argv += [
        "--listen",
        "127.0.0.1:0",
        "--state",
        str(tmp_path),
        "--log-format",
        "text",
        "--log-level",
        "debug",
    ]
    done = truba(*argv, "--", sys.executable, "-m", "truba", "status")
    assert done.returncode == 0, done.stdout + done.stderr
    text_line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) +\S+")
    for name in ("scheduler", "daemon-0"):
        records = [
            line
            for line in (tmp_path / "logs" / f"{name}.log").read_text().splitlines()
            if line and not line.startswith(("--- truba:", "truba scheduler ", " "))
        ]
        assert records and all(text_line.match(line) for line in records), (name, records[:5])
        assert any(" DEBUG " in line for line in records), name
