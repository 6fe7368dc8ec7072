"""How fair the planner keeps a busy cluster: a discrete-event simulation that uses only the planner.

Jobs arrive as a Poisson stream; each has a heavy-tailed number of tasks (Pareto) and its own
heavy-tailed task times (lognormal around a lognormal median), and an importance of 1, 2, 5 or
10. The cluster is --daemons daemons of --slots slots. The planner runs on every job arrival and
finish and every --tick seconds (demand = the job's tasks left, running + backlog), with the
default Policy; the simulated daemons then follow the plan:

  graceful   a slot taken from a job finishes its running task first, then serves the new job
  immediate  the running task is interrupted at once and goes back to its job's backlog
  grace:N    graceful, bounded: a task still running N seconds after its slot was taken is
             interrupted as in immediate (the job setting preemption_grace=N)

Measured, per mode, at every tick:
  Jain         Jain's index of actual/ideal over the active jobs, where actual = slots running the
               job's tasks and ideal = the weighted max-min fair share capped by demand (fluid);
               1.0 is perfectly fair. Reported: mean over ticks, 5th percentile, share >= goal.
  Jain(plan)   the same for the planned slots (what the planner asked for, before preemption lag)
  Jain bound   the best Jain's index any placement could reach at that tick, given the jobs that
               drain (graceful: running more than planned and than ideal, so only their task ends
               can lower them; bench/jain_bound.py): the other jobs' running slots split at will
  to share     per job: seconds from its arrival until it first runs at least floor(ideal) tasks
               (0 if at once); p50 / p95 over the jobs that got there before finishing
  moves/job-h  slots the planner moved from one job to another, per job-hour of active jobs
  moves/need   moves over the moves the arrivals needed at least (each new job's floor(ideal) less
               the free slots when it came): 1.0 means no slot moved that did not have to
  lost %       work thrown away by interrupted tasks, in % of the cluster's capacity

The planner is given each running task's expected end (--drains estimate, the default: the
job's moving-average task time minus the time the task ran, as the scheduler estimates it from
heartbeats, truba.scheduler.drains.expected_ends), so graceful moves take the slots that free
soonest; --drains none plans without (the planner before issue 19), --drains oracle with the
true ends (the bound an estimate can reach).

    python bench/fairness.py [--hours 1] [--load 0.9] [--task-scale 1] [--seed 1]
                             [--drains estimate|none|oracle] [--modes graceful,grace:60,immediate]
                             [--json ...]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jain_bound import best_jain

from truba.scheduler.drains import expected_ends
from truba.scheduler.planner import Capacity, JobSpec, gains, job_totals, plan
from truba.scheduler.waterfill import at_level, level

IMPORTANCE = [(1.0, 0.5), (2.0, 0.3), (5.0, 0.15), (10.0, 0.05)]
JAIN_GOAL = 0.98


@dataclass
class SimJob:
    id: str
    importance: float
    arrived: float
    tasks: int
    median: float
    backlog: int
    running: int = 0
    service_time: float = 0.0
    """Moving average of its task times so far, as a daemon reports it (0: none ended yet)."""
    reached: float | None = None
    finished: float | None = None

    def task_time(self, rng: random.Random) -> float:
        return min(600.0, rng.lognormvariate(math.log(self.median), 0.5))


@dataclass
class Daemon:
    id: str
    slots: int
    want: dict[str, int] = field(default_factory=dict)
    """The plan's share per job."""
    running: dict[str, list[int]] = field(default_factory=dict)
    """Task tokens running per job."""

    def busy(self) -> int:
        return sum(len(tokens) for tokens in self.running.values())


def draw_job(rng: random.Random, i: int, now: float, scale: float = 1.0) -> SimJob:
    importance = rng.choices([w for w, _ in IMPORTANCE], [p for _, p in IMPORTANCE])[0]
    tasks = int(min(200_000, 300 / rng.random() ** (1 / 1.5)))  # Pareto, alpha 1.5, from 300
    median = scale * min(30.0, max(0.05, rng.lognormvariate(0.0, 0.8)))
    return SimJob(f"job-{i:05d}", importance, now, tasks, median, backlog=tasks)


def mean_work(seed: int, scale: float) -> float:
    """Mean slot-seconds per job, estimated by sampling (mean task time: median * e^(0.5^2/2))."""
    rng = random.Random(seed)
    jobs = [draw_job(rng, i, 0.0, scale) for i in range(50_000)]
    return statistics.fmean(j.tasks * j.median * math.exp(0.125) for j in jobs)


def ideal(jobs: list[SimJob], capacity: int) -> dict[str, float]:
    """Weighted max-min fair shares capped by demand (tasks left), as a fluid."""
    demand = [float(j.backlog + j.running) for j in jobs]
    weights = [j.importance for j in jobs]
    lam = level(weights, [0.0] * len(jobs), demand, float(capacity))
    return {j.id: at_level(w, 0.0, d, lam) for j, w, d in zip(jobs, weights, demand, strict=True)}


def jain(actual: dict[str, int], fair: dict[str, float]) -> float | None:
    ratios = [actual.get(j, 0) / x for j, x in fair.items() if x > 1e-9]
    if len(ratios) < 2:
        return None
    return sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios)) if any(ratios) else 0.0


class Simulation:
    """One run in one preemption mode."""

    def __init__(
        self, args: argparse.Namespace, immediate: bool, gap: float, grace: float | None = None
    ) -> None:
        self.rng = random.Random(args.seed)
        self.task_rng = random.Random(args.seed + 1)
        self.immediate = immediate
        self.grace = grace
        self.over_since: dict[tuple[str, str], float] = {}
        """(daemon, job) -> since when it runs more tasks there than planned (grace mode)."""
        self.lost_work = 0.0
        self.gap = gap
        self.scale = args.task_scale
        self.end = args.hours * 3600.0
        self.tick = args.tick
        self.daemons = [Daemon(f"d{i:03d}", args.slots) for i in range(args.daemons)]
        self.capacity = args.daemons * args.slots
        self.jobs: dict[str, SimJob] = {}
        self.done: list[SimJob] = []
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.tokens: dict[int, tuple[Daemon, str]] = {}
        self.spans: dict[int, tuple[float, float]] = {}
        """Token -> (start, end) of the running task."""
        self.drains = args.drains
        self.next_token = 0
        self.assignment: dict[str, dict[str, int]] = {d.id: {} for d in self.daemons}
        self.given_at: dict[tuple[str, str], float] = {}
        self.fair: dict[str, float] = {}
        self.moves = 0
        self.needed = 0
        self.interrupts = 0
        self.plans = 0
        self.plan_seconds = 0.0
        self.jain_actual: list[float] = []
        self.jain_plan: list[float] = []
        self.jain_bound: list[float] = []
        self.job_seconds = 0.0

    def push(self, at: float, kind: str, payload: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def run(self) -> dict[str, object]:
        self.push(self.rng.expovariate(1 / self.gap), "arrive")
        self.push(self.tick, "tick")
        arrivals = 0
        now = 0.0
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            if now > self.end:
                break
            if kind == "arrive":
                job = draw_job(self.rng, arrivals, now, self.scale)
                arrivals += 1
                self.jobs[job.id] = job
                self.push(now + self.rng.expovariate(1 / self.gap), "arrive")
                free = self.capacity - sum(job_totals(self.assignment).values())
                share = ideal(list(self.jobs.values()), self.capacity)[job.id]
                self.needed += max(0, math.floor(share + 1e-9) - free)
                self.replan(now)
            elif kind == "tick":
                self.replan(now)
                self.sample()
                self.push(now + self.tick, "tick")
            elif kind == "task":
                assert isinstance(payload, int)
                self.task_done(now, payload)
        return self.report(arrivals)

    # -- the scheduler side ----------------------------------------------------------------

    def replan(self, now: float) -> None:
        active = list(self.jobs.values())
        specs = [
            JobSpec(j.id, "sim:task", j.importance, j.arrived, demand=j.backlog + j.running) for j in active
        ]
        began = time.perf_counter()
        result = plan(
            [Capacity(d.id, d.slots, ("*",)) for d in self.daemons],
            specs,
            self.assignment,
            now=now,
            given_at=self.given_at,
            ends=self.ends(now),
        )
        self.plan_seconds += time.perf_counter() - began
        self.plans += 1
        self.moves += result.moves
        for pair in gains(self.assignment, result.assignment):
            self.given_at[pair] = now
        self.assignment = result.assignment
        self.fair = ideal(active, self.capacity)
        for daemon in self.daemons:
            daemon.want = result.assignment[daemon.id]
            self.follow(daemon, now)
        for job in active:
            self.check_reached(job, now)

    def ends(self, now: float) -> dict[tuple[str, str], list[float]] | None:
        """What the scheduler estimates from heartbeats: each running task's expected end."""
        if self.drains == "none" or self.immediate:  # an immediate job's slots free at once
            return None
        out: dict[tuple[str, str], list[float]] = {}
        for daemon in self.daemons:
            for job_id, tokens in daemon.running.items():
                if not tokens:
                    continue
                if self.drains == "oracle":
                    out[(daemon.id, job_id)] = sorted(self.spans[t][1] for t in tokens)
                else:
                    job = self.jobs[job_id]
                    starts = [self.spans[t][0] for t in tokens]
                    out[(daemon.id, job_id)] = expected_ends(starts, job.service_time, now)
                if self.grace is not None:  # as the scheduler caps them (ReportedEnds' graces)
                    out[(daemon.id, job_id)] = [
                        min(end, now + self.grace) for end in out[(daemon.id, job_id)]
                    ]
        return out

    # -- the daemon side -------------------------------------------------------------------

    def follow(self, daemon: Daemon, now: float) -> None:
        """Applies the plan: interrupt what is over its share (immediate mode; grace mode once
        it has been over for the grace), fill free slots."""
        for job_id, tokens in daemon.running.items():
            key = (daemon.id, job_id)
            if len(tokens) <= daemon.want.get(job_id, 0):
                self.over_since.pop(key, None)
                continue
            if self.grace is not None and now - self.over_since.setdefault(key, now) < self.grace:
                continue
            if not self.immediate and self.grace is None:
                continue
            while len(tokens) > daemon.want.get(job_id, 0):
                token = tokens.pop()  # the latest started: the least work lost
                del self.tokens[token]
                self.lost_work += now - self.spans.pop(token)[0]
                job = self.jobs[job_id]
                job.running -= 1
                job.backlog += 1
                self.interrupts += 1
            self.over_since.pop(key, None)
        self.fill(daemon, now)

    def fill(self, daemon: Daemon, now: float) -> None:
        free = daemon.slots - daemon.busy()
        for job_id, want in sorted(daemon.want.items()):
            job = self.jobs.get(job_id)
            if job is None:
                continue
            tokens = daemon.running.setdefault(job_id, [])
            while free > 0 and len(tokens) < want and job.backlog > 0:
                self.start(daemon, job, now)
                free -= 1

    def start(self, daemon: Daemon, job: SimJob, now: float) -> None:
        token = self.next_token
        self.next_token += 1
        self.tokens[token] = (daemon, job.id)
        daemon.running.setdefault(job.id, []).append(token)
        job.backlog -= 1
        job.running += 1
        end = now + job.task_time(self.task_rng)
        self.spans[token] = (now, end)
        self.push(end, "task", token)
        self.check_reached(job, now)

    def check_reached(self, job: SimJob, now: float) -> None:
        if job.reached is None and job.running >= math.floor(self.fair.get(job.id, 0.0) + 1e-9):
            job.reached = now

    def task_done(self, now: float, token: int) -> None:
        place = self.tokens.pop(token, None)
        if place is None:
            return  # interrupted
        daemon, job_id = place
        daemon.running[job_id].remove(token)
        job = self.jobs[job_id]
        took = now - self.spans.pop(token)[0]
        job.service_time += (took - job.service_time) * (0.2 if job.service_time else 1.0)
        job.running -= 1
        if job.backlog == 0 and job.running == 0:
            job.finished = now
            self.done.append(self.jobs.pop(job_id))
            self.replan(now)
            return
        self.fill(daemon, now)

    # -- measurement -----------------------------------------------------------------------

    def sample(self) -> None:
        self.job_seconds += len(self.jobs) * self.tick
        fair = ideal(list(self.jobs.values()), self.capacity)
        actual = {j.id: j.running for j in self.jobs.values()}
        value = jain(actual, fair)
        if value is not None:
            self.jain_actual.append(value)
            totals = job_totals(self.assignment)
            planned = jain(totals, fair)
            if planned is not None:
                self.jain_plan.append(planned)
            self.jain_bound.append(self.bound(fair, totals))

    def bound(self, fair: dict[str, float], planned: dict[str, int]) -> float:
        """The best Jain's index at this tick with the draining jobs as they are (jain_bound.py)."""
        fixed: list[float] = []
        free: list[tuple[float, float]] = []
        draining = 0
        for job_id, x in fair.items():
            if x <= 1e-9:
                continue
            job = self.jobs[job_id]
            if job.running > x and job.running > planned.get(job_id, 0):
                fixed.append(job.running / x)
                draining += job.running
            else:
                free.append((x, float(job.backlog + job.running)))
        return best_jain(fixed, free, float(self.capacity - draining))

    def report(self, arrivals: int) -> dict[str, object]:
        jobs = self.done + list(self.jobs.values())
        waits = sorted(j.reached - j.arrived for j in jobs if j.reached is not None)
        instant = sum(1 for j in jobs if j.reached is not None and j.reached == j.arrived)
        never = sum(1 for j in jobs if j.reached is None)
        job_hours = self.job_seconds / 3600
        values = sorted(self.jain_actual)

        def pct(xs: list[float], q: float) -> float:
            return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else float("nan")

        return {
            "jobs": arrivals,
            "finished": len(self.done),
            "jain_mean": statistics.fmean(values) if values else float("nan"),
            "jain_p5": pct(values, 0.05),
            "jain_at_goal": sum(v >= JAIN_GOAL for v in values) / len(values) if values else float("nan"),
            "jain_plan_mean": statistics.fmean(self.jain_plan) if self.jain_plan else float("nan"),
            "jain_bound_mean": statistics.fmean(self.jain_bound) if self.jain_bound else float("nan"),
            "to_share_p50_s": pct(waits, 0.50) if waits else 0.0,
            "to_share_p95_s": pct(waits, 0.95) if waits else 0.0,
            "to_share_at_once": instant,
            "to_share_never": never,
            "moves_per_job_hour": self.moves / job_hours if job_hours else 0.0,
            "moves_over_needed": self.moves / self.needed if self.needed else float("nan"),
            "interrupts_per_job_hour": self.interrupts / job_hours if job_hours else 0.0,
            "work_lost_pct": 100 * self.lost_work / (self.capacity * self.end),
            "plans": self.plans,
            "plan_ms_mean": 1000 * self.plan_seconds / max(1, self.plans),
        }


def print_table(result: dict[str, dict[str, object]]) -> None:
    columns: list[tuple[str, str, Callable[[object], str]]] = [
        ("jobs", "jobs", lambda v: f"{v}"),
        ("Jain mean", "jain_mean", lambda v: f"{v:.3f}"),
        ("Jain p5", "jain_p5", lambda v: f"{v:.3f}"),
        (f">={JAIN_GOAL}", "jain_at_goal", lambda v: f"{100 * float(v):.0f}%"),  # type: ignore[arg-type]
        ("Jain(plan)", "jain_plan_mean", lambda v: f"{v:.3f}"),
        ("Jain bound", "jain_bound_mean", lambda v: f"{v:.3f}"),
        ("share p50 s", "to_share_p50_s", lambda v: f"{v:.2f}"),
        ("share p95 s", "to_share_p95_s", lambda v: f"{v:.2f}"),
        ("moves/job-h", "moves_per_job_hour", lambda v: f"{v:.0f}"),
        ("moves/need", "moves_over_needed", lambda v: f"{v:.2f}"),
        ("lost %", "work_lost_pct", lambda v: f"{v:.2f}"),
        ("plan ms", "plan_ms_mean", lambda v: f"{v:.2f}"),
    ]
    print("\n" + f"{'mode':<11}" + "".join(f"{name:>13}" for name, _, _ in columns))
    for mode, row in result.items():
        print(f"{mode:<11}" + "".join(f"{fmt(row[key]):>13}" for _, key, fmt in columns))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0, help="simulated time")
    parser.add_argument("--daemons", type=int, default=32)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--load", type=float, default=0.9, help="offered work / capacity")
    parser.add_argument("--tick", type=float, default=0.25, help="seconds between plans and samples")
    parser.add_argument("--task-scale", type=float, default=1.0, help="multiplies every task time")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drains", choices=["estimate", "none", "oracle"], default="estimate")
    parser.add_argument(
        "--modes", default="graceful,immediate", help="comma-separated: graceful, immediate, grace:SECONDS"
    )
    parser.add_argument("--json", type=Path, default=Path("bench/results/fairness.json"))
    args = parser.parse_args()
    gap = mean_work(args.seed, args.task_scale) / (args.load * args.daemons * args.slots)
    print(f"{args.daemons} daemons x {args.slots} slots, a job every {gap:.1f} s on average", flush=True)
    result: dict[str, dict[str, object]] = {}
    for mode in args.modes.split(","):
        began = time.perf_counter()
        grace = float(mode.split(":", 1)[1]) if mode.startswith("grace:") else None
        if mode not in ("graceful", "immediate") and grace is None:
            parser.error(f"unknown mode {mode!r}: graceful, immediate or grace:SECONDS")
        result[mode] = Simulation(args, mode == "immediate", gap, grace).run()
        print(f"  {mode}: simulated in {time.perf_counter() - began:.0f} s", flush=True)
    print_table(result)
    print(f"\ngoal: Jain >= {JAIN_GOAL}; a new job at its share within 1 s with immediate preemption")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) for k, v in vars(args).items()}
    args.json.write_text(json.dumps({"args": settings, "results": result}, indent=2))
    print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
