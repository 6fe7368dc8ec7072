"""One chaos run: start a cluster, run the planned jobs under the planned faults, check.

``python -m tests.chaos.run --minutes 30 [--seed N] [--workdir DIR]`` (what ``scripts/soak``
runs) prints the seed first, the faults as they happen, and at the end the counts: faults
injected by kind, tasks, outcomes, lost, duplicated and unexpected outcomes, duplicate and
interrupted executions, and each process's resident memory at the start, middle and end. Exits 1
if the checker found a lost, duplicated or unexpected outcome, or the jobs did not finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.checker import Verdict, check
from tests.chaos.nemesis import Nemesis
from tests.chaos.plan import plan_faults, plan_jobs
from tests.chaos.rig import Rig

JOBS_OUTLAST = 20.0
"""Seconds the jobs' submissions go on past the faults' planned end."""


@dataclass
class Result:
    seed: int
    verdict: Verdict
    finished: bool
    injected: dict[str, int]
    skipped: dict[str, int]
    anomalies: list[str]
    memory: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    slow_connects: int = 0
    """Connects (a channel, a queue declare, a Basic.Consume) that took longer than the pipes'
    connect timeout and were tried again: how often a restarted broker's queue did not answer."""

    @property
    def ok(self) -> bool:
        return self.finished and self.verdict.ok

    def report(self) -> str:
        lines = [
            f"chaos seed={self.seed} finished={self.finished} in {self.seconds:.0f} s "
            f"(load average {self.load[0]:.1f} {self.load[1]:.1f} {self.load[2]:.1f})",
            f"faults injected: {sum(self.injected.values())} {dict(sorted(self.injected.items()))}",
            f"faults skipped (nothing to hit): {dict(sorted(self.skipped.items()))}",
            f"anomalies (died without a fault): {len(self.anomalies)} {self.anomalies[:10]}",
            f"connects given up after the pipes' timeout and retried: {self.slow_connects}",
            f"checker: {self.verdict.summary()}",
            "memory, RSS MiB start -> middle -> end:",
        ]
        roles = sorted({role for sample in self.memory.values() for role in sample})
        for role in roles:
            values = [self.memory.get(when, {}).get(role) for when in ("start", "middle", "end")]
            lines.append(f"  {role:12} " + " -> ".join("-" if v is None else f"{v:.0f}" for v in values))
        details = self.verdict.details()
        if details:
            lines.append(details)
        return "\n".join(lines)


async def _sample(rig: Rig, samples: list[tuple[float, dict[str, float]]], every: float) -> None:
    """Resident memory of every process every ``every`` s, until cancelled (from 5 s on: the
    client starts with the faults)."""
    await asyncio.sleep(5.0)
    while True:
        samples.append((time.time(), await asyncio.to_thread(rig.rss)))
        await asyncio.sleep(every)


async def _jobs_created(workdir: Path, count: int, timeout: float) -> int:
    """Waits (at most ``timeout`` s) until the client's state lists ``count`` jobs; how many it does."""
    deadline = time.time() + timeout
    created = 0
    while time.time() < deadline:
        try:
            created = len(json.loads((workdir / "client" / "state.json").read_text())["jobs"])
        except (OSError, ValueError, KeyError):
            created = 0
        if created >= count:
            break
        await asyncio.sleep(0.5)
    return created


def _slow_connects(workdir: Path) -> int:
    """``pipe.reopen.broken`` lines of a connect that timed out, in every process's log."""
    count = 0
    for path in [*(workdir / "cluster" / "logs").glob("*.log*"), workdir / "client.log"]:
        if path.exists():
            count += sum(
                "connect took longer" in line for line in path.read_text(errors="replace").splitlines()
            )
    return count


def _memory(samples: list[tuple[float, dict[str, float]]], middle: float) -> dict[str, dict[str, float]]:
    """Per role, its first sample (start), the one nearest ``middle`` and its last (end), each
    taken while the process was up (a process being restarted measures 0 and is skipped)."""
    memory: dict[str, dict[str, float]] = {"start": {}, "middle": {}, "end": {}}
    for role in sorted({role for _, sample in samples for role in sample}):
        alive = [(t, s[role]) for t, s in samples if s.get(role, 0.0) > 0.0]
        if alive:
            memory["start"][role] = alive[0][1]
            memory["middle"][role] = min(alive, key=lambda ts: abs(ts[0] - middle))[1]
            memory["end"][role] = alive[-1][1]
    return memory


async def run(
    seed: int,
    fault_seconds: float,
    finish_seconds: float,
    workdir: Path,
    echo: bool = True,
    rate_scale: float = 1.0,
) -> Result:
    """Runs the planned jobs under ``fault_seconds`` of faults, then waits up to ``finish_seconds``
    for the client to take every outcome, and checks."""
    rng = random.Random(seed)
    # The jobs outlast the faults a little: faults start once the first jobs exist.
    jobs = plan_jobs(rng, fault_seconds + JOBS_OUTLAST, rate_scale=rate_scale)
    rig = Rig(workdir)
    faults = plan_faults(
        rng, fault_seconds, brokers=rig.broker_count, daemons=rig.daemon_count, jobs=len(jobs)
    )
    (workdir / "jobs.json").parent.mkdir(parents=True, exist_ok=True)
    (workdir / "jobs.json").write_text(json.dumps([j.to_json() for j in jobs], indent=1))
    (workdir / "faults.json").write_text(json.dumps([f.__dict__ for f in faults], indent=1))
    began = time.time()
    memory: dict[str, dict[str, float]] = {}
    samples: list[tuple[float, dict[str, float]]] = []
    finished = False
    nemesis: Nemesis | None = None
    with open(workdir / "nemesis.log", "a") as out:
        try:
            await asyncio.to_thread(rig.start)
            nemesis = Nemesis(rig, seed, out, echo=echo)
            (workdir / "t0").write_text(repr(nemesis.t0))
            nemesis.note(
                "start", seed=seed, jobs=len(jobs), tasks=sum(j.tasks for j in jobs), faults=len(faults)
            )
            rig.start_client()
            # Faults are timed from when the first jobs exist (a loaded machine takes a while to
            # start the client): before, a slot or template kill finds none to hit.
            created = await _jobs_created(workdir, min(4, len(jobs)), timeout=120.0)
            nemesis.t0 = time.time()
            nemesis.note("jobs.created", jobs=created)
            sampler = asyncio.create_task(_sample(rig, samples, every=min(10.0, fault_seconds / 12)))
            await nemesis.run(faults, fault_seconds)
            nemesis.note("faults.over", injected=dict(nemesis.injected))
            deadline = time.time() + finish_seconds
            while time.time() < deadline:
                if await nemesis.supervise():
                    finished = True
                    break
                await asyncio.sleep(0.5)
            sampler.cancel()
            memory = _memory(samples, nemesis.t0 + fault_seconds / 2)
            nemesis.note("end", finished=finished)
            if not finished and echo:
                print(rig.logs(), file=sys.stderr)
        finally:
            await asyncio.to_thread(rig.stop)
    assert nemesis is not None
    verdict = check(workdir, nemesis.client_kills)
    return Result(
        seed=seed,
        verdict=verdict,
        finished=finished,
        injected=dict(nemesis.injected),
        skipped=dict(nemesis.skipped),
        anomalies=nemesis.anomalies,
        memory=memory,
        seconds=time.time() - began,
        load=os.getloadavg(),
        slow_connects=_slow_connects(workdir),
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of faults (default 30)")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: a random seed)")
    parser.add_argument("--finish", type=float, default=300.0, help="seconds for the jobs to finish after")
    parser.add_argument(
        "--rate",
        type=float,
        default=1.0,
        help="scale every job's task rate (default 1; 0.5 on a busy machine)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep the run's files here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    replay = f"scripts/soak --minutes {args.minutes:g} --rate {args.rate:g} --seed {seed}"
    print(f"chaos seed {seed} (replay: {replay})", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"truba-chaos-{seed}-"))
    print(f"chaos workdir {workdir}", flush=True)
    result = asyncio.run(run(seed, args.minutes * 60, args.finish, workdir, rate_scale=args.rate))
    print(result.report(), flush=True)
    print(f"chaos seed {seed}: {'PASS' if result.ok else 'FAIL'}", flush=True)
    if result.ok and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
