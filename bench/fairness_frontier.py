"""Jain vs moves per job-hour in graceful mode: the planner as it is, and prototype policies.

Runs bench/fairness.py's simulation (graceful preemption, expected ends estimated) once per
variant and prints Jain's index of running slots (mean, p5), its bound (jain_bound.py), time to
share and moves per job-hour. The variants change the planner's move phase from outside (they are
experiments, not planner options):

  main           the planner as it is
  deadband:D     Policy(deadband=D): fewer moves with a wider deadband
  effective:W    moves judged on the running allocation, W of the way: a job's target is raised by
                 W x (its planned slots - its running tasks), so a receiver whose slots still drain
                 takes more (from the soonest-draining donors) and a donor whose slots drain gives
                 more; 1.0 plans on the running allocation alone
  lagging:W      the same for receivers only (jobs running fewer tasks than planned)
  hedge:A        jobs whose tasks take 3 s or more on average held A below their fair share (the
                 rest share the difference), so an arrival finds less of them to drain

    python bench/fairness_frontier.py [--hours 0.25] [--seeds 1,2,3,4]
                                      [--variants main,deadband:3,effective:0.25,...]
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import fairness

from truba.scheduler import moves, planner
from truba.scheduler.draft import DraftAssignment
from truba.scheduler.moves import Outcome

Rebalance = Callable[..., Outcome]
DEFAULT_VARIANTS = "main,deadband:3,lagging:0.5,effective:0.25,effective:0.5,hedge:0.15"
LONG_TASK = 3.0
"""Seconds: a job whose mean task time is this or more is hedged (hedge:A)."""


def adjusted(sim: fairness.Simulation, variant: str, value: float) -> Rebalance:
    """moves.rebalance with each job's target changed as ``variant`` says."""

    def rebalance(
        draft: DraftAssignment,
        targets: Mapping[str, float],
        floors: Mapping[str, int],
        ranks: Mapping[str, int],
        **kwargs: Any,
    ) -> Outcome:
        new = dict(targets)
        if variant in ("effective", "lagging"):
            for job_id in new:
                job = sim.jobs.get(job_id)
                if job is None:
                    continue
                lag = draft.totals.get(job_id, 0) - job.running
                if variant == "effective" or lag > 0:
                    new[job_id] += value * lag
        elif variant == "hedge":
            weight = {
                j: 1.0 - value if (job := sim.jobs.get(j)) and job.service_time >= LONG_TASK else 1.0
                for j in new
            }
            scaled = sum(t * weight[j] for j, t in new.items())
            if scaled > 0:
                total = sum(new.values())
                new = {j: t * weight[j] * total / scaled for j, t in new.items()}
        return moves.rebalance(draft, new, floors, ranks, **kwargs)

    return rebalance


def run(args: argparse.Namespace, seed: int, variant: str) -> dict[str, object]:
    name, _, raw = variant.partition(":")
    value = float(raw) if raw else 0.0
    sim_args = argparse.Namespace(
        hours=args.hours, daemons=32, slots=8, load=0.9, tick=0.25, task_scale=1.0, seed=seed
    )
    sim_args.drains = "estimate"
    gap = fairness.mean_work(seed, 1.0) / (0.9 * 32 * 8)
    sim = fairness.Simulation(sim_args, False, gap)
    bench = cast(Any, fairness)
    plan_module = cast(Any, planner)
    saved_plan, saved_rebalance = bench.plan, plan_module.rebalance
    try:
        if name == "deadband":
            bench.plan = functools.partial(planner.plan, policy=planner.Policy(deadband=value))
        elif name in ("effective", "lagging", "hedge"):
            plan_module.rebalance = adjusted(sim, name, value)
        elif name != "main":
            raise SystemExit(f"unknown variant {variant!r}")
        return sim.run()
    finally:
        bench.plan, plan_module.rebalance = saved_plan, saved_rebalance


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=0.25)
    parser.add_argument("--seeds", default="1,2,3,4")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    heads = f"{'Jain':>8}{'p5':>7}{'bound':>7}{'plan':>7}{'p50 s':>7}{'p95 s':>7}{'moves/job-h':>13}"
    print(f"{'variant':<16}{'seed':>5}{heads}")
    for variant in args.variants.split(","):
        rows = []
        for seed in seeds:
            r = run(args, seed, variant)
            rows.append(r)
            print(
                f"{variant:<16}{seed:>5}{_f(r, 'jain_mean', 4):>8}{_f(r, 'jain_p5', 3):>7}"
                f"{_f(r, 'jain_bound_mean', 3):>7}{_f(r, 'jain_plan_mean', 3):>7}"
                f"{_f(r, 'to_share_p50_s', 2):>7}{_f(r, 'to_share_p95_s', 2):>7}"
                f"{_f(r, 'moves_per_job_hour', 0):>13}",
                flush=True,
            )
        if len(rows) > 1:
            jain = math.fsum(cast(float, r["jain_mean"]) for r in rows) / len(rows)
            moved = math.fsum(cast(float, r["moves_per_job_hour"]) for r in rows) / len(rows)
            print(f"{variant:<16}{'mean':>5}{jain:>8.4f}{'':>41}{moved:>13.0f}", flush=True)
    return 0


def _f(row: dict[str, object], key: str, digits: int) -> str:
    return f"{cast(float, row[key]):.{digits}f}"


if __name__ == "__main__":
    raise SystemExit(main())
