"""Tasks in order per key on a real cluster (issue 16, seed 001): many small keys and one hot key
run each key's tasks one at a time in submission order, the small keys done long before the hot
one; retries (``retry_on``), a daemon killed -9 mid-run, and a client killed -9 and resumed from
its journal break no key's order.

The handler (``tests.handlers.ordered``) writes every attempt's start to a log (killed attempts
too) and returns its start and end; order is checked on both."""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from pathlib import Path

import pytest

from tests.handlers.flaky import Busy
from tests.integration.processes import ALLOW, running
from truba.client import Client, Outcome
from truba.local.cluster import TrubaProcess

pytestmark = pytest.mark.integration

HANDLER = "tests.handlers.ordered:run"
CHILD = Path(__file__).with_name("keys_client_proc.py")
SMALL_KEYS = 50
SMALL_TASKS = 30
HOT_TASKS = 2000
"""The hot key's tasks: one round trip each (about 3 ms here), one after another."""


def attempts(log: Path) -> dict[str, list[tuple[int, int]]]:
    """Per key, ``(start, seq)`` of every attempt the handler logged (killed ones too), by start."""
    runs: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for line in log.read_text().splitlines():
        key, seq, start = line.split()
        runs[key].append((int(start), int(seq)))
    return {key: sorted(found) for key, found in runs.items()}


def check_every_run_in_order(log: Path) -> None:
    """No faults: every attempt of a key's tasks started in seq order."""
    for key, runs in attempts(log).items():
        seqs = [seq for _, seq in runs]
        assert seqs == sorted(seqs), key


def check_first_runs_in_order(log: Path) -> int:
    """With faults: each task's first attempt started after the previous task's first attempt
    (a task may run again, at least once, after a fault: docs/client.md). Returns how many
    attempts were logged."""
    logged = attempts(log)
    for key, runs in logged.items():
        first: dict[int, int] = {}
        for start, seq in runs:
            first.setdefault(seq, start)
        assert sorted(first, key=first.__getitem__) == sorted(first), key
    return sum(map(len, logged.values()))


def check_outcomes(outcomes: list[Outcome], tasks: dict[str, int]) -> None:
    """Every key's outcomes: all there, and each task started after the one before it ended."""
    by_key: dict[str, list[list[int]]] = collections.defaultdict(list)
    for outcome in outcomes:
        assert outcome.ok, outcome
        key, seq, start, end = outcome.result()
        by_key[key].append([seq, start, end])
    assert {key: len(runs) for key, runs in by_key.items()} == tasks
    for key, runs in by_key.items():
        runs.sort()
        assert [seq for seq, _, _ in runs] == list(range(tasks[key])), key
        for (_, _, end), (seq, start, _) in zip(runs, runs[1:], strict=False):
            assert start > end, f"key {key}: task {seq} started before task {seq - 1} ended"


async def test_every_keys_tasks_run_in_order_and_small_keys_finish_long_before_a_hot_one(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    """50 keys × 30 tasks and one hot key of 2,000, the hot key's submitted first."""
    log = tmp_path / "starts.log"
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job(HANDLER, name="keys")
            began = time.monotonic()
            for seq in range(HOT_TASKS):  # the hot key's tasks first: they must not hold the others
                await job.submit([str(log), "hot", seq, 0], key="hot")
            for seq in range(SMALL_TASKS):
                for k in range(SMALL_KEYS):
                    await job.submit([str(log), f"k{k}", seq, 0], key=f"k{k}")
            submitted = time.monotonic() - began
            await job.close()
            outcomes: list[Outcome] = []
            done_at: dict[str, float] = {}
            async with asyncio.timeout(100):
                async for outcome in job.results():
                    outcomes.append(outcome)
                    done_at[outcome.result()[0]] = time.monotonic() - began
            assert job.done
    tasks = {"hot": HOT_TASKS, **{f"k{k}": SMALL_TASKS for k in range(SMALL_KEYS)}}
    check_outcomes(outcomes, tasks)
    check_every_run_in_order(log)
    small_done = max(at for key, at in done_at.items() if key != "hot")
    hot_done = done_at["hot"]
    print(f"submitted in {submitted:.1f} s; small keys done at {small_done:.1f} s, hot at {hot_done:.1f} s")
    assert small_done < hot_done / 2


async def test_retries_and_a_daemon_killed_mid_run_break_no_keys_order(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    log = tmp_path / "starts.log"
    keys, per_key, seconds = 20, 20, 0.05
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job(
                HANDLER, name="keys-kill", retry_on=[Busy], backoff=(0.05, 0.1), max_attempts=5
            )
            for seq in range(per_key):
                for k in range(keys):
                    busy = ["busy once"] if seq % 5 == 2 else []  # retried after a backoff
                    await job.submit([str(log), f"k{k}", seq, seconds, *busy], key=f"k{k}")
            await job.close()
            outcomes: list[Outcome] = []
            heir: asyncio.Task[TrubaProcess] | None = None
            async with asyncio.timeout(100):
                async for outcome in job.results():
                    outcomes.append(outcome)
                    if len(outcomes) == keys * per_key // 3:  # a third done: d0 dies mid-task
                        cluster.daemons[0].kill()
                        heir = asyncio.create_task(
                            asyncio.to_thread(cluster.local.start_daemon, "d2", 2, ALLOW)
                        )
            assert job.done and heir is not None
            cluster.daemons.append(await heir)
    check_outcomes(outcomes, {f"k{k}": per_key for k in range(keys)})
    assert all(o.attempts >= 2 for o in outcomes if o.result()[1] % 5 == 2)
    assert check_first_runs_in_order(log) > keys * per_key  # the kill cut attempts short


async def test_a_client_killed_and_resumed_from_its_journal_keeps_every_keys_order(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    log, journal = tmp_path / "starts.log", tmp_path / "journal"
    keys, per_key = 20, 20
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=2, slots=2) as cluster:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), cluster.address, str(journal), str(log), str(keys), str(per_key),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert child.stdout is not None
        job_id, got = "", set[tuple[str, int]]()
        async with asyncio.timeout(60):
            while len(got) < keys * per_key // 3:
                line = (await child.stdout.readline()).decode()
                assert line, f"the client exited early (rc {await child.wait()})"
                kind, _, value = line.strip().partition(" ")
                if kind == "job":
                    job_id = value
                elif kind == "got":
                    key, seq = value.split()
                    got.add((key, int(seq)))
        child.kill()  # mid-stream: some keys' next tasks released, sent or not yet
        await child.wait()
        for line in (await child.stdout.read()).decode().splitlines():  # said before it died
            kind, _, value = line.partition(" ")
            if kind == "got":
                key, seq = value.split()
                got.add((key, int(seq)))

        async with Client(cluster.address, journal=journal) as client:
            job = await client.resume(job_id)
            rest: list[tuple[str, int]] = []
            async with asyncio.timeout(60):
                async for outcome in job.results():
                    key, seq, _, _ = outcome.result()
                    rest.append((key, seq))
            assert job.done
    every = {(f"k{k}", seq) for k in range(keys) for seq in range(per_key)}
    assert got | set(rest) == every  # every task has its outcome (those got but not taken come again)
    assert len(rest) == len(set(rest))
    check_first_runs_in_order(log)
