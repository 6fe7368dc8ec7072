"""How much memory a slot process holds privately, from ``/proc/<pid>/smaps_rollup`` (Linux 4.14+).

The measure is USS (``Private_Clean + Private_Dirty``, plus private huge pages): the memory that
would be freed if the process exited. RSS would count the interpreter's shared libraries once per
slot, and PSS changes when another slot exits; USS is what a leak grows. Swapped-out private
pages (``Swap``) count too, so a leak cannot hide in swap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

_PRIVATE: Final = ("Private_Clean:", "Private_Dirty:", "Private_Hugetlb:", "Swap:")
PROC: Final = Path("/proc")


def private_bytes(pid: int, proc: Path = PROC) -> int | None:
    """The process's private memory in bytes, or None if it is gone (or /proc cannot tell)."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    return parse_private_kib(text) * 1024


def parse_private_kib(smaps_rollup: str) -> int:
    """Sums the private fields (in kB) of an smaps_rollup text."""
    total = 0
    for line in smaps_rollup.splitlines():
        if line.startswith(_PRIVATE):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                total += int(parts[1])
    return total
