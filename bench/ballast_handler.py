"""The handler of bench/slot_memory.py, imported by the slots as ``bench.ballast_handler``: it holds
``$TRUBA_BENCH_BALLAST_MIB`` MiB of bytes from import on, as a handler that loads a model would."""

from __future__ import annotations

import os

MIB = 1024 * 1024
BALLAST = b"\x01" * (int(os.environ.get("TRUBA_BENCH_BALLAST_MIB", "0")) * MIB)
"""Allocated (and written) at import, in each process that imports this module."""


def size(_: object) -> int:
    """The handler: the ballast's size in bytes."""
    return len(BALLAST)
