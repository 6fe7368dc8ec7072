"""What every benchmark does with its numbers: percentiles, and the JSON file it writes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def write_json(path: Path, data: object) -> None:
    """Writes ``data`` to ``path`` (folders made as needed) and says so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    print(f"\nwritten {path}")


class Steal:
    """The share of the machine's CPU time its hypervisor gave to others (``steal`` in
    /proc/stat) since the last :meth:`lap`: how noisy a measurement's surroundings were."""

    def __init__(self) -> None:
        self._last = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            with open("/proc/stat") as stat:
                ticks = [int(field) for field in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        return (ticks[7] if len(ticks) > 7 else 0), sum(ticks)

    def lap(self) -> float:
        """Stolen share of all CPU time since the previous lap (0.0 where unknown)."""
        now = self._read()
        stolen, total = now[0] - self._last[0], now[1] - self._last[1]
        self._last = now
        return stolen / total if total > 0 else 0.0


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far (0.0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


class CpuMeter:
    """CPU seconds used by groups of processes between :meth:`start` and :meth:`stop`.

    ``groups`` maps a name to a function returning the group's pids at that moment (slots come
    and go, so their group is read at both ends); ``self`` is this process (all its threads)."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = groups
        self._began: dict[str, dict[int, float]] = {}
        self._self = 0.0

    def start(self) -> None:
        self._began = {name: {pid: cpu_seconds(pid) for pid in pids()} for name, pids in self.groups.items()}
        times = os.times()
        self._self = times.user + times.system

    def stop(self) -> dict[str, float]:
        """Seconds per group (processes started meanwhile count from 0), and ``client``: this process."""
        used: dict[str, float] = {}
        for name, pids in self.groups.items():
            began = self._began.get(name, {})
            used[name] = sum(max(0.0, cpu_seconds(pid) - began.get(pid, 0.0)) for pid in pids())
        times = os.times()
        used["client"] = times.user + times.system - self._self
        return used
