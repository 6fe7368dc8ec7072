"""Processes seen through /proc: a process's descendants, a daemon's fork templates and slots,
and resident memory (RSS)."""

from __future__ import annotations

import os
from pathlib import Path


def _read(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def ppid(pid: int) -> int:
    stat = _read(pid, "stat")
    if not stat:
        return -1
    return int(stat.rsplit(b")", 1)[1].split()[1])


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and ppid(int(entry)) == pid:
            found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children, their children, ...)."""
    table: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            table.setdefault(ppid(int(entry)), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in table.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def is_template(pid: int) -> bool:
    return b"truba.daemon.template" in _read(pid, "cmdline")


def templates(daemon_pid: int) -> list[int]:
    """The daemon's fork-server templates (its children running ``truba.daemon.template``)."""
    return [p for p in children(daemon_pid) if is_template(p)]


def slots(daemon_pid: int) -> list[int]:
    """The daemon's slot processes: spawned ones (its children that are not templates) and the
    ones its templates forked."""
    found = []
    for child in children(daemon_pid):
        found += children(child) if is_template(child) else [child]
    return found


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB (0 if it is gone)."""
    for line in _read(pid, "status").splitlines():
        if line.startswith(b"VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
