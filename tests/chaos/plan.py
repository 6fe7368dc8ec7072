"""What a chaos run does, drawn from one seed: the jobs the client runs and the faults it suffers.

Everything random in a run comes from ``random.Random(seed)`` here, so a seed replays the same
jobs (options, task counts, pacing) and the same schedule of faults (kind, target, when, for how
long). The wall clock still differs between runs (a restart takes as long as it takes), so the
interleaving is alike, not identical.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Final

FAULT_KINDS: Final = (
    "broker_kill",
    "daemon_kill",
    "slot_kill",
    "template_kill",
    "scheduler_kill",
    "client_kill",
    "stall",
    "cut",
    "alarm",
    "importance",
)
"""Every kind of fault the nemesis injects; a short run injects each at least once."""

WEIGHTS: Final = {
    "broker_kill": 1.0,
    "daemon_kill": 1.5,
    "slot_kill": 2.0,
    "template_kill": 1.0,
    "scheduler_kill": 1.0,
    "client_kill": 1.5,
    "stall": 1.5,
    "cut": 1.5,
    "alarm": 1.0,
    "importance": 2.0,
}


@dataclass(frozen=True)
class JobSpec:
    """One job the client runs: ``tasks`` tasks submitted ``rate`` per second from ``start`` s."""

    tag: str
    start: float
    tasks: int
    rate: float
    frames: bool
    queue_type: str
    preemption: str
    importance: float
    sleep_ms: tuple[int, int]

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        low, high = data["sleep_ms"]
        return cls(
            tag=str(data["tag"]),
            start=float(data["start"]),
            tasks=int(data["tasks"]),
            rate=float(data["rate"]),
            frames=bool(data["frames"]),
            queue_type=str(data["queue_type"]),
            preemption=str(data["preemption"]),
            importance=float(data["importance"]),
            sleep_ms=(int(low), int(high)),
        )


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on ``target`` (an index into brokers, daemons or jobs), planned at ``at``
    seconds into the run, healed after ``hold`` seconds (0 for an instant fault)."""

    at: float
    kind: str
    target: int
    hold: float
    value: float = 0.0


def plan_jobs(rng: random.Random, seconds: float, lanes: int = 4, rate_scale: float = 1.0) -> list[JobSpec]:
    """Jobs over ``seconds`` of faults: ``lanes`` at a time, each lane a chain of jobs of random
    options (frames on and off, quorum and classic queues, graceful and immediate preemption).
    The first four jobs cover all four combinations of frames and queue type. ``rate_scale``
    multiplies every job's rate (after the draw: a seed plans the same jobs at any scale), for a
    machine that cannot keep up with the default rates under the faults."""
    combos = [
        (True, "quorum", "graceful"),
        (False, "classic", "immediate"),
        (True, "classic", "graceful"),
        (False, "quorum", "immediate"),
    ]
    jobs: list[JobSpec] = []
    for lane in range(lanes):
        start = lane * 2.0
        while start < seconds * 0.8 or not any(j.tag.startswith(f"l{lane}") for j in jobs):
            span = min(seconds - start, rng.uniform(60.0, 240.0))
            span = max(span, seconds * 0.5) if start == lane * 2.0 else max(span, 20.0)
            rate = rng.uniform(3.0, 8.0) * rate_scale
            frames, queue_type, preemption = (
                combos[lane % 4]
                if start == lane * 2.0
                else (
                    rng.random() < 0.5,
                    rng.choice(["quorum", "classic"]),
                    rng.choice(["graceful", "immediate"]),
                )
            )
            jobs.append(
                JobSpec(
                    tag=f"l{lane}j{sum(1 for j in jobs if j.tag.startswith(f'l{lane}'))}",
                    start=round(start, 1),
                    tasks=max(20, int(span * rate)),
                    rate=round(rate, 2),
                    frames=frames,
                    queue_type=queue_type,
                    preemption=preemption,
                    importance=rng.choice([0.5, 1.0, 2.0]),
                    sleep_ms=(5, rng.choice([20, 50, 200])),
                )
            )
            start += span + rng.uniform(1.0, 10.0)
    return jobs


def plan_faults(
    rng: random.Random, seconds: float, *, brokers: int, daemons: int, jobs: int, begin: float = 5.0
) -> list[Fault]:
    """Faults from ``begin`` to ``seconds``: every kind once in a random order first, then kinds
    drawn by :data:`WEIGHTS`; gaps of 1-5 s between one fault's heal and the next fault."""
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    names, weights = list(WEIGHTS), list(WEIGHTS.values())
    faults: list[Fault] = []
    at = begin
    while at < seconds:
        kind = kinds.pop(0) if kinds else rng.choices(names, weights)[0]
        hold = {
            "broker_kill": rng.uniform(1.0, 8.0),
            "daemon_kill": rng.uniform(0.5, 5.0),
            "scheduler_kill": rng.uniform(0.5, 6.0),
            "client_kill": rng.uniform(0.5, 4.0),
            "stall": rng.uniform(1.0, 10.0),
            "alarm": rng.uniform(1.0, 8.0),
        }.get(kind, 0.0)
        count = {"broker_kill": brokers, "stall": brokers, "cut": brokers, "alarm": brokers}.get(
            kind, daemons
        )
        if kind == "importance":
            count = jobs
        value = rng.choice([0.1, 0.5, 1.0, 3.0, 10.0]) if kind == "importance" else 0.0
        faults.append(Fault(round(at, 2), kind, rng.randrange(max(1, count)), round(hold, 2), value))
        at += hold + rng.uniform(1.0, 5.0)
    return faults
