"""What a runner runs its job's tasks by, shared by its parts: the handler, the job's settings
(a resize may change them) and the slot policy."""

from __future__ import annotations

from dataclasses import dataclass

from truba.daemon.settings import JobSettings


@dataclass(frozen=True)
class SlotPolicy:
    """When a slot is replaced: after ``max_tasks`` tasks, or over ``memory_soft`` bytes after a
    task; ``memory_hard`` bytes kill it during a task (None: no such limit)."""

    max_tasks: int | None = None
    memory_soft: int | None = None
    memory_hard: int | None = None


@dataclass
class JobTerms:
    """The handler, settings and slot policy one runner applies now."""

    handler: str
    settings: JobSettings
    policy: SlotPolicy
