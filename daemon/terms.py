"""What a runner runs its job's tasks by, shared by its parts: the handler, the job's settings
(a resize may change them) and the slot policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from truba.daemon.settings import JobSettings
from truba.daemon.slot_main import PICKLE_SUFFIX
from truba.wire import ErrorInfo


@dataclass(frozen=True)
class SlotPolicy:
    """When a slot is replaced: after ``max_tasks`` tasks, or over ``memory_soft`` bytes after a
    task; ``memory_hard`` bytes kill it during a task (None: no such limit). ``allow_pickle``:
    slots may run jobs whose payloads are pickled (``truba daemon --allow-pickle``; unpickling
    runs code of the payload's choosing)."""

    max_tasks: int | None = None
    memory_soft: int | None = None
    memory_hard: int | None = None
    allow_pickle: bool = False


@dataclass
class JobTerms:
    """The handler, settings and slot policy one runner applies now."""

    handler: str
    settings: JobSettings
    policy: SlotPolicy

    @property
    def entry(self) -> str:
        """The handler as a slot is handed it: marked for pickled payloads in a pickle job."""
        return self.handler + PICKLE_SUFFIX if self.settings.pickle else self.handler

    @property
    def refusal(self) -> ErrorInfo | None:
        """Why this daemon runs none of the job's tasks (each gets this error), or None."""
        if self.settings.pickle and not self.policy.allow_pickle:
            return PICKLE_REFUSED
        return None


PICKLE_REFUSED: Final = ErrorInfo(
    "PickleRefused",
    "this job's payloads are pickled (codec='pickle'), and unpickling runs code of the payload's"
    " choosing: this daemon was not started with --allow-pickle, so it runs none of its tasks",
)
