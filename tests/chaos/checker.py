"""The chaos run's checker (Jepsen-style): from what the client took and what the slots ran,
does every submitted task have exactly one outcome with the right value?

Inputs, all in the run's folder: ``jobs.json`` (the plan: each job's tag and task count),
``client/outcomes.<pid>`` (a JSON line per outcome each client incarnation took, flushed before
it asked for the next) and ``executions/<pid>`` (``S tag i`` / ``E tag i`` lines the handler
wrote per slot process). ``kills`` are the wall-clock times at which the client was killed -9.

An outcome taken twice counts as a duplicate, except the ones the contract allows: an outcome
counts as taken when the next one is asked for, and its journal mark is written once the event
loop turns, so the last outcomes a client took right before a kill -9 come again after the
resume. Those (taken by the killed incarnation within ``REDELIVERY_WINDOW`` seconds of its kill)
are counted apart as ``redelivered_after_client_kill``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tests.handlers.chaos import expected

REDELIVERY_WINDOW: Final = 2.0


@dataclass
class Verdict:
    tasks: int = 0
    outcomes: int = 0
    lost: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    redelivered_after_client_kill: int = 0
    executions: int = 0
    duplicate_executions: int = 0
    """Executions that ran to the end beyond the first per task (at-least-once: allowed)."""
    interrupted_executions: int = 0
    """Executions that started and never ended (a slot, template or daemon killed mid-task, or
    an immediate preemption)."""
    attempts_spent: Counter[int] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.unexpected)

    def summary(self) -> str:
        return (
            f"tasks={self.tasks} outcomes={self.outcomes} lost={len(self.lost)} "
            f"duplicates={len(self.duplicates)} unexpected={len(self.unexpected)} "
            f"redelivered_after_client_kill={self.redelivered_after_client_kill} "
            f"executions={self.executions} duplicate_executions={self.duplicate_executions} "
            f"interrupted_executions={self.interrupted_executions} "
            f"attempts={dict(sorted(self.attempts_spent.items()))}"
        )

    def details(self, limit: int = 20) -> str:
        lines = []
        for name, items in (
            ("lost", self.lost),
            ("duplicates", self.duplicates),
            ("unexpected", self.unexpected),
        ):
            if items:
                lines.append(f"{name} ({len(items)}): {items[:limit]}")
        return "\n".join(lines)


def _records(folder: Path) -> list[tuple[int, dict[str, Any]]]:
    """(incarnation pid, record) of every incarnation, in the order they were taken (by their
    wall-clock stamps); a torn last line of a killed incarnation is skipped."""
    found = []
    for path in folder.glob("outcomes.*"):
        pid = int(path.suffix[1:])
        for line in path.read_text().splitlines():
            try:
                found.append((pid, json.loads(line)))
            except ValueError:
                continue
    found.sort(key=lambda item: float(item[1].get("t") or 0.0))
    return found


def check(workdir: Path, kills: list[tuple[int, float]]) -> Verdict:
    """``kills``: (pid, wall time) of each client incarnation killed -9."""
    plan = json.loads((workdir / "jobs.json").read_text())
    sizes = {str(j["tag"]): int(j["tasks"]) for j in plan}
    verdict = Verdict(tasks=sum(sizes.values()))
    killed_at = dict(kills)
    taken: dict[tuple[str, int], tuple[int, float, str]] = {}
    for pid, record in _records(workdir / "client"):
        verdict.outcomes += 1
        tag, value = str(record["tag"]), record.get("value")
        where = f"{tag}:{record.get('task_id')}"
        if not record.get("ok") or not isinstance(value, list) or len(value) != 3:
            verdict.unexpected.append(f"{where} not ok: {record.get('error')} {value!r}")
            continue
        i = int(value[1])
        if tag not in sizes or not 0 <= i < sizes[tag] or value != expected(tag, i) or value[0] != tag:
            verdict.unexpected.append(f"{where} wrong value {value!r}")
            continue
        verdict.attempts_spent[int(record.get("attempts") or 1)] += 1
        key = (tag, i)
        if key in taken:
            first_pid, first_t, first_id = taken[key]
            kill = killed_at.get(first_pid)
            if first_id != record.get("task_id"):
                verdict.unexpected.append(f"{tag}:{i} has two task ids {first_id} {record.get('task_id')}")
            elif kill is not None and first_pid != pid and kill - REDELIVERY_WINDOW <= first_t <= kill:
                verdict.redelivered_after_client_kill += 1
            else:
                verdict.duplicates.append(f"{tag}:{i} ({first_id}) taken by {first_pid} then {pid}")
            continue
        taken[key] = (pid, float(record.get("t") or 0.0), str(record.get("task_id")))
    for tag, size in sizes.items():
        verdict.lost += [f"{tag}:{i}" for i in range(size) if (tag, i) not in taken]
    started: Counter[tuple[str, int]] = Counter()
    ended: Counter[tuple[str, int]] = Counter()
    for path in (workdir / "executions").glob("*"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue
            key = (parts[1], int(parts[2]))
            (started if parts[0] == "S" else ended)[key] += 1
    verdict.executions = sum(ended.values())
    verdict.duplicate_executions = sum(n - 1 for n in ended.values() if n > 1)
    verdict.interrupted_executions = sum(started.values()) - sum(ended.values())
    return verdict
