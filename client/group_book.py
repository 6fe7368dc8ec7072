"""Where a job's groups are kept: one small log per group in the job's journal folder.

``groups/<name>.log`` holds length-prefixed pickled records, appended as things happen::

    ("task", task_id)       a task joined the group (written once its submit returned)
    ("closed",)             the group takes no more tasks
    ("outcome", Outcome)    a member's outcome, written before the journal forgets its task
    ("fired",)              the ``on_done`` callback returned (fsynced)

A resumed client reads every log back (:meth:`GroupBook.load`): which groups are open, which
outcomes they have, and whether their callback fired, so that it fires once. A torn last record
(a crash mid-write) is ignored. With ``journal=False`` nothing is written.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final

from truba.client.outcome import Outcome

log = logging.getLogger(__name__)

GROUPS_DIR: Final = "groups"
_SIZE: Final = struct.Struct("<I")
NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""A group's name: it names its file."""


@dataclass(slots=True)
class GroupState:
    """What a group's log says."""

    name: str
    members: list[str] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    closed: bool = False
    fired: bool = False


@final
class GroupBook:
    """The logs of one job's groups (``directory`` None: kept in memory only)."""

    def __init__(self, directory: Path | None) -> None:
        self._directory = None if directory is None else directory / GROUPS_DIR

    def load(self) -> list[GroupState]:
        """Every group of the job, as its log says (a resumed job)."""
        if self._directory is None or not self._directory.is_dir():
            return []
        groups = [_read(path) for path in sorted(self._directory.glob("*.log"))]
        log.info("client.groups.loaded", extra={"directory": str(self._directory), "groups": len(groups)})
        return groups

    def append(self, name: str, record: tuple[object, ...], *, sync: bool = False) -> None:
        """Appends one record to the group's log (``sync``: and fsyncs it)."""
        if self._directory is None:
            return
        data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._directory.mkdir(exist_ok=True)  # not the job's folder: gone once the job ended
            with open(self._directory / f"{name}.log", "ab") as file:
                file.write(_SIZE.pack(len(data)) + data)
                file.flush()
                if sync:
                    os.fsync(file.fileno())
        except OSError as exc:  # the job ended (cancelled: its folder is gone), or the disk failed
            log.warning("client.groups.write_failed", extra={"group": name, "error": str(exc)})


def _read(path: Path) -> GroupState:
    state = GroupState(path.name.removesuffix(".log"))
    data = path.read_bytes()
    offset = 0
    while offset + _SIZE.size <= len(data):
        (size,) = _SIZE.unpack_from(data, offset)
        end = offset + _SIZE.size + size
        if end > len(data):
            log.warning("client.groups.torn_record", extra={"path": str(path), "offset": offset})
            break
        record = pickle.loads(data[offset + _SIZE.size : end])
        offset = end
        kind = record[0]
        if kind == "task":
            state.members.append(record[1])
        elif kind == "outcome":
            outcome: Outcome = record[1]
            state.outcomes.setdefault(outcome.task_id, outcome)
        elif kind == "closed":
            state.closed = True
        elif kind == "fired":
            state.fired = True
    return state
