"""How many slots a daemon runs when ``--slots`` is not given: as many as CPUs and memory allow.

Method: ``slots = max(1, min(cpus, memory // per_slot))`` where

- ``cpus`` is the number of CPUs this process may run on (its affinity mask), lowered by a
  cgroup CPU quota if one is set (``cpu.max`` on cgroup v2, ``cpu.cfs_quota_us`` on v1), rounded
  up: a slot is one busy process, more slots than CPUs only adds switching;
- ``memory`` is ``MemAvailable`` from ``/proc/meminfo``, lowered to what the memory cgroup still
  allows (``memory.max - memory.current``, or the v1 ``limit_in_bytes - usage_in_bytes``);
- ``per_slot`` is the memory one slot may use: its hard limit if set, else its soft limit, else
  :data:`DEFAULT_SLOT_MEMORY`.

Every source is read defensively: one that is missing or unreadable is ignored.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Final

DEFAULT_SLOT_MEMORY: Final = 512 * 1024 * 1024
CGROUP: Final = Path("/sys/fs/cgroup")
_UNLIMITED: Final = 1 << 60  # cgroup v1 writes "no limit" as a huge number


def default_slots(per_slot: int | None = None, root: Path = Path("/")) -> int:
    """The default slot count (see the module docstring)."""
    per_slot = per_slot or DEFAULT_SLOT_MEMORY
    cpus = usable_cpus(root)
    memory = available_memory(root)
    by_memory = memory // per_slot if memory is not None else cpus
    return max(1, min(cpus, by_memory))


def usable_cpus(root: Path = Path("/")) -> int:
    """CPUs this process may use: affinity, lowered by a cgroup quota (rounded up)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cpu_quota(root / CGROUP.relative_to("/"))
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def available_memory(root: Path = Path("/")) -> int | None:
    """Bytes this process could still allocate: MemAvailable, lowered by a cgroup limit."""
    candidates = [m for m in (_meminfo_available(root), _cgroup_room(root / CGROUP.relative_to("/"))) if m]
    return min(candidates) if candidates else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpu_quota(cgroup: Path) -> float | None:
    v2 = _read(cgroup / "cpu.max")  # "max 100000" or "150000 100000"
    if v2 is not None:
        parts = v2.split()
        if len(parts) == 2 and parts[0] != "max" and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]) / max(1, int(parts[1]))
        return None
    quota, period = _read(cgroup / "cpu" / "cpu.cfs_quota_us"), _read(cgroup / "cpu" / "cpu.cfs_period_us")
    if quota and period and quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0:
        return int(quota) / max(1, int(period))
    return None


def _meminfo_available(root: Path) -> int | None:
    text = _read(root / "proc" / "meminfo")
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def _cgroup_room(cgroup: Path) -> int | None:
    for limit_file, usage_file in (
        (cgroup / "memory.max", cgroup / "memory.current"),
        (cgroup / "memory" / "memory.limit_in_bytes", cgroup / "memory" / "memory.usage_in_bytes"),
    ):
        limit, usage = _read(limit_file), _read(usage_file)
        if limit is None or not limit.isdigit():
            continue
        if int(limit) >= _UNLIMITED:
            return None
        used = int(usage) if usage is not None and usage.isdigit() else 0
        return max(0, int(limit) - used)
    return None
