"""Tasks a daemon put back carry a random copy id: tests compare them without it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from truba.wire import TaskMessage


def uncopied(tasks: Iterable[TaskMessage]) -> list[TaskMessage]:
    """``tasks`` (each a copy a daemon put back: a copy id of its own) with their copy id cleared."""
    found = list(tasks)
    assert all(task.copy_id != 0 for task in found), f"not copies: {found}"
    assert len({task.copy_id for task in found}) == len(found), f"a copy id twice: {found}"
    return [dataclasses.replace(task, copy_id=0) for task in found]
