"""What ``truba up`` keeps in its ``--state`` directory between runs, and who owns it now.

- ``cluster.json``: each local node's name and ports and the scheduler's address, so the next
  run on the same state brings the nodes back on the same ports with their data (the queues,
  their messages, the clients' URLs survive a restart), and the pids it started, so a run can
  tell when processes of an earlier one are still alive (``truba up`` killed with SIGKILL
  leaves its scheduler and daemons running).
- ``up.lock``: held (``flock``) by the ``truba up`` that runs on the state, with its pid inside.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from truba.errors import TrubaError

LAYOUT_FILE: Final = "cluster.json"
LOCK_FILE: Final = "up.lock"


class StateInUse(TrubaError):
    """Another ``truba up`` (or what an earlier one left running) uses this state directory."""


@dataclass(frozen=True)
class SavedNode:
    """A local node as the last run left it."""

    name: str
    port: int
    dist_port: int


@dataclass
class SavedCluster:
    """The layout of the last run on a state directory."""

    nodes: list[SavedNode] = field(default_factory=list)
    scheduler: str = ""
    pids: list[tuple[int, int]] = field(default_factory=list)
    """The scheduler's and daemons' pids, each with its start time (:func:`started_at`)."""

    @classmethod
    def load(cls, state: Path) -> SavedCluster:
        """The saved layout; what cannot be read of it is left empty."""
        saved = cls()
        try:
            data = json.loads((state / LAYOUT_FILE).read_text())
        except (OSError, ValueError):
            return saved
        try:
            saved.nodes = [
                SavedNode(str(n["name"]), int(n["port"]), int(n["dist_port"])) for n in data["nodes"]
            ]
            saved.scheduler = str(data.get("scheduler", ""))
        except (KeyError, TypeError, ValueError, AttributeError):
            saved.nodes, saved.scheduler = [], ""
        try:
            saved.pids = [(int(pid), int(start)) for pid, start in data.get("pids", [])]
        except (TypeError, ValueError, AttributeError):
            saved.pids = []
        return saved

    def save(self, state: Path) -> None:
        """Writes the layout (atomically: a crash leaves the old one or the new one)."""
        state.mkdir(parents=True, exist_ok=True)
        temporary = state / f"{LAYOUT_FILE}.tmp"
        data = {
            "nodes": [{"name": n.name, "port": n.port, "dist_port": n.dist_port} for n in self.nodes],
            "scheduler": self.scheduler,
            "pids": [list(pair) for pair in self.pids],
        }
        temporary.write_text(json.dumps(data, indent=2) + "\n")
        temporary.replace(state / LAYOUT_FILE)

    def leftovers(self) -> list[int]:
        """Pids of the last run's processes that still run (the same pid started at the same time)."""
        return [pid for pid, start in self.pids if started_at(pid) == start]


def started_at(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot), or -1 when there is no such process.

    A pid and its start time name one process: a pid reused later has another start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    # The command name (field 2) may hold spaces and parentheses: count from its closing one.
    return int(stat.rpartition(")")[2].split()[19])


@contextlib.contextmanager
def owning(state: Path) -> Iterator[None]:
    """Holds ``state`` for this process for the block.

    Raises:
        StateInUse: another ``truba up`` holds it, or processes of an earlier run still use it;
            the message says which pid and what to do.
    """
    state.mkdir(parents=True, exist_ok=True)
    handle = (state / LOCK_FILE).open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "?"
            raise StateInUse(
                f"a cluster is already up on {state} (truba up, pid {owner}); stop it with Ctrl-C in its "
                f"terminal or `kill {owner}`, or pass another --state"
            ) from None
        left = SavedCluster.load(state).leftovers()
        if left:
            pids = " ".join(map(str, left))
            raise StateInUse(
                f"processes of an earlier truba up on {state} still run (pids {pids}); stop them with "
                f"`kill {pids}`, or pass another --state"
            )
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()
