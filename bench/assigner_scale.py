"""The scheduler's own work per heartbeat and per new job at 2,000-10,000 daemons, without gRPC.

``bench/scheduler_load.py`` measures the whole scheduler over real gRPC, with simulated daemons
on the same machine; on a small shared machine the simulator, RabbitMQ and the kernel's network
stack take most of the CPU, and its numbers say more about the machine than about the scheduler.
This bench runs the scheduler's :class:`~truba.scheduler.assigner.Assigner` in one process on
sessions with no stream behind them, and times what the scheduler's loop does itself:

  heartbeat   one heartbeat handled as the servicer does (``Assigner.heartbeat`` and the running
              list), CPU µs each: idle (nothing changed) and busy (every heartbeat reports tasks
              done on two jobs)
  check       the demand check a busy second asks for (no job's demand changed: no plan), ms
  steady      a plan that changes nothing, ms
  new job     CreateJob's plan and pushes on the busy cluster: the planner moves a quarter of the
              slots (two background jobs of importance 1 and 2, the new one 1), and every
              daemon's outbox holds its new assignment, ms; and the same before this work
              (the moves' old scan, at most 512 moves per plan, one plan per replan delay)
              estimated from one plan (--old); and with packing off (--spread: a new job's
              slots spread over every daemon, as before moves.PACK_DEFICIT)

Daemons have 4 or 8 slots, alternately, and allow every handler. Times are CPU time of this
process (``time.process_time``), so a machine shared with other work does not inflate them.

    python bench/assigner_scale.py [--daemons 2000 5000 10000] [--old] [--spread]
                                   [--json bench/results/assigner_scale.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from truba.proto.v1 import daemons_pb2
from truba.scheduler import moves
from truba.scheduler.assigner import Assigner
from truba.scheduler.counters import JobCounters
from truba.scheduler.model import Job, JobState
from truba.scheduler.planner import Policy
from truba.scheduler.registry import DaemonInfo, DaemonRegistry, DaemonSession
from truba.scheduler.running import DaemonRunning

HANDLER = "bench.noop:f"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cluster(n: int, clock: Clock, old: bool) -> tuple[Assigner, list[Job], list[DaemonSession], JobCounters]:
    registry = DaemonRegistry()
    jobs: list[Job] = []
    counters = JobCounters()
    policy = Policy(max_moves_share=0.0) if old else None
    assigner = Assigner(
        registry, lambda: list(jobs), heartbeat_interval=1.0, clock=clock, counters=counters, policy=policy
    )
    sessions = [
        DaemonSession(DaemonInfo(f"sim-{i:05d}", 4 if i % 2 == 0 else 8, ("*",)), {}, clock())
        for i in range(n)
    ]
    for session in sessions:
        registry.add(session)
    for importance in (1.0, 2.0):
        jobs.append(job(f"bg{importance:g}", importance, len(jobs)))
    assigner.replan()
    clock.now += 10.0
    return assigner, jobs, sessions, counters


def job(job_id: str, importance: float, created: float) -> Job:
    return Job(id=job_id, handler=HANDLER, importance=importance, state=JobState.OPEN, created_at=created)


def scan(self: moves._Rebalance, donor: str, receiver: str) -> tuple[str | None, bool]:
    """The donor's daemon as it was found before the index: a scan of its daemons, each move."""
    best: tuple[int, int, str] | None = None
    held = False
    mine = self.draft.by_job.get(receiver, {})
    for daemon, n in self.draft.by_job.get(donor, {}).items():
        if not self.pools.may_run(daemon, self.handler[receiver]):
            continue
        if self.on_hold(daemon, donor):
            held = True
            continue
        key = (mine.get(daemon, 0), -n, daemon)
        if best is None or key < best:
            best = key
    return (best[2] if best is not None else None), held


def heartbeat(session: DaemonSession, done: int, busy: bool) -> daemons_pb2.Heartbeat:
    return daemons_pb2.Heartbeat(
        applied_version=session.version,
        running=[daemons_pb2.JobSlots(job_id=j, slots=n) for j, n in session.held.items()],
        stats=[
            daemons_pb2.JobStats(job_id=j, done=done * n if busy else 0, busy_slots=n if busy else 0)
            for j, n in session.held.items()
        ],
    )


def per_heartbeat_us(assigner: Assigner, sessions: list[DaemonSession], busy: bool) -> float:
    """CPU µs per heartbeat over one round of every daemon (messages built beforehand)."""
    rounds = [[heartbeat(s, r + 1, busy) for s in sessions] for r in range(2)]
    for s, hb in zip(sessions, rounds[0], strict=True):  # the first round primes the last stats
        assigner.heartbeat(s, hb)
    began = time.process_time()
    for s, hb in zip(sessions, rounds[1], strict=True):
        assigner.heartbeat(s, hb)
        s.running = DaemonRunning.of(hb)
    return (time.process_time() - began) / len(sessions) * 1e6


def timed_ms(call: Any) -> float:
    """CPU ms of ``call`` (process time: on a shared machine, waiting for a core is not counted)."""
    began = time.process_time()
    call()
    return (time.process_time() - began) * 1000


def measure(n: int, old: bool, spread: bool = False) -> dict[str, object]:
    clock = Clock()
    gc.collect()
    assigner, jobs, sessions, _ = cluster(n, clock, old)
    for s in sessions:  # the first assignments written
        s._outbox.clear()
    result: dict[str, object] = {"daemons": n, "slots": sum(s.info.slots for s in sessions)}
    result["heartbeat_idle_us"] = round(per_heartbeat_us(assigner, sessions, busy=False), 1)
    result["heartbeat_busy_us"] = round(per_heartbeat_us(assigner, sessions, busy=True), 1)
    result["demand_check_ms"] = round(timed_ms(assigner._check_demand), 1)
    result["steady_plan_ms"] = round(statistics.median(timed_ms(assigner.replan) for _ in range(3)), 1)
    jobs.append(job("new", 1.0, len(jobs)))
    plans: list[float] = []
    with pytest.MonkeyPatch.context() as patch:
        if old:
            patch.setattr(moves._Rebalance, "_daemon_for", scan)
        if spread:
            patch.setattr(moves, "PACK_DEFICIT", math.inf)
        plans.append(timed_ms(assigner.replan))
    reached = sum(1 for s in sessions if s._outbox)
    holders = sum(1 for s in sessions if "new" in s.held)
    result["new_job_first_plan_ms"] = round(plans[0], 1)
    result["new_job_daemons_after_first_plan"] = holders
    result["new_job_outboxes_filled"] = reached
    result["new_job_slots_after_first_plan"] = assigner.slots_of("new")
    result["new_job_fair_share"] = round(assigner.fair_share_of("new"), 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--daemons", type=int, nargs="+", default=[2000, 5000, 10000])
    parser.add_argument("--old", action="store_true", help="also the moves' old scan, 512 moves a plan")
    parser.add_argument("--spread", action="store_true", help="also with packing off (the plans before it)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/assigner_scale.json"))
    args = parser.parse_args()
    runs = []
    for n in args.daemons:
        variants = [(False, False)] + [(True, False)] * args.old + [(False, True)] * args.spread
        for old, spread in variants:
            row = asyncio.run(_measure(n, old, spread))
            row["variant"] = (
                "before (scan, 512 moves a plan)" if old else "spread (packing off)" if spread else "now"
            )
            runs.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(
        f"\n{'daemons':>8} {'variant':<32}{'hb idle µs':>11}{'hb busy µs':>11}{'check ms':>9}"
        f"{'steady ms':>10}{'new job ms':>11}{'moved to':>9}{'of share':>9}{'daemons':>9}"
    )
    for r in runs:
        print(
            f"{r['daemons']:>8} {r['variant']:<32}{r['heartbeat_idle_us']:>11}{r['heartbeat_busy_us']:>11}"
            f"{r['demand_check_ms']:>9}{r['steady_plan_ms']:>10}{r['new_job_first_plan_ms']:>11}"
            f"{r['new_job_slots_after_first_plan']:>9}{r['new_job_fair_share']:>9}"
            f"{r['new_job_daemons_after_first_plan']:>9}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "assigner_scale", "runs": runs}, indent=2))
    print(f"\nwritten {args.json}")
    return 0


async def _measure(n: int, old: bool, spread: bool) -> dict[str, object]:
    return measure(n, old, spread)  # in a loop: demand checks and resends may schedule timers


if __name__ == "__main__":
    sys.exit(main())
