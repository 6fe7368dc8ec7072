"""Handlers that misbehave on purpose: leak memory, hog it, outlive timeouts, report where they ran."""

from __future__ import annotations

import os
import time

MIB = 1024 * 1024
_kept: list[bytes] = []


def leak(mib: int) -> int:
    """Keeps ``mib`` MiB more for the life of the slot (a leak); returns the slot's total kept."""
    _kept.append(b"\x01" * (mib * MIB))  # touched pages: they count as private memory
    return sum(len(b) for b in _kept) // MIB


def hog(payload: list[float]) -> int:
    """Takes ``payload[0]`` MiB at once, then sleeps ``payload[1]`` s (a task over a hard limit)."""
    mib, seconds = payload
    block = b"\x01" * int(mib * MIB)
    time.sleep(seconds)
    return len(block) // MIB


def stamp(seconds: float) -> dict[str, float]:
    """Sleeps ``seconds``; returns when it started and ended (wall clock) and the slot's pid."""
    began = time.time()
    time.sleep(seconds)
    return {"began": began, "ended": time.time(), "pid": float(os.getpid())}


def pid(seconds: float) -> int:
    """Sleeps ``seconds``, returns the slot's pid (to find and kill the slot running a task)."""
    time.sleep(seconds)
    return os.getpid()


def sleep_in_file(payload: list[object]) -> float:
    """Writes the slot's pid to ``payload[0]`` then sleeps ``payload[1]`` s (a test kills it)."""
    path, seconds = str(payload[0]), float(payload[1])  # type: ignore[arg-type]
    with open(path, "w") as file:
        file.write(str(os.getpid()))
    time.sleep(seconds)
    return seconds


def count_runs(payload: list[object]) -> float:
    """Appends the slot's pid to ``payload[0]`` (a line per run), then sleeps ``payload[1]`` s."""
    path, seconds = str(payload[0]), float(payload[1])  # type: ignore[arg-type]
    with open(path, "a") as file:
        file.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return seconds


def sleep_once(payload: list[object]) -> dict[str, float]:
    """Sleeps ``payload[1]`` s the first time it runs (marker file ``payload[0]``), ``payload[2]`` after.

    Returns when it started (wall clock) and how long it slept: a task that is slow only on its
    first attempt (to be interrupted or timed out), then quick.
    """
    path, first, later = str(payload[0]), float(payload[1]), float(payload[2])  # type: ignore[arg-type]
    began = time.time()
    try:
        with open(path, "x") as file:
            file.write(str(os.getpid()))
        seconds = first
    except FileExistsError:
        seconds = later
    time.sleep(seconds)
    return {"began": began, "slept": seconds, "pid": float(os.getpid())}
