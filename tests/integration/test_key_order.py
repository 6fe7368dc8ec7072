"""Tasks in order per key on a real cluster (issue 16, seed 001): many small keys and one hot key
run each key's tasks one at a time in submission order, the small keys done long before the hot
one; retries (``retry_on``) and a daemon killed -9 mid-run break no key's order.

The handler (``tests.handlers.ordered``) writes every attempt's start to a log (killed attempts
too) and returns its start and end; order is checked on both."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import pytest

from tests.handlers.flaky import Busy
from tests.integration.processes import ALLOW, running
from truba.client import Client, Outcome
from truba.local.cluster import TrubaProcess

pytestmark = pytest.mark.integration

HANDLER = "tests.handlers.ordered:run"
SMALL_KEYS = 100
SMALL_TASKS = 50
HOT_TASKS = 5000
"""The hot key's tasks: one round trip each (about 5 ms here), one after another."""


def starts_in_order(log: Path) -> dict[str, list[int]]:
    """Per key, the seqs of every attempt (from the handler's log), by start time: a key's
    order holds if each list is non-decreasing (an attempt repeated after a kill is fine;
    a later task starting before an earlier one's last attempt is not)."""
    attempts: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for line in log.read_text().splitlines():
        key, seq, start = line.split()
        attempts[key].append((int(start), int(seq)))
    return {key: [seq for _, seq in sorted(runs)] for key, runs in attempts.items()}


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
    """100 keys × 50 tasks and one hot key of 5,000, the hot key's submitted first."""
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
    for key, seqs in starts_in_order(log).items():
        assert seqs == sorted(seqs), key
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
    attempts = starts_in_order(log)
    for key, seqs in attempts.items():
        assert seqs == sorted(seqs), key
    assert sum(map(len, attempts.values())) > keys * per_key  # the kill cut attempts short
