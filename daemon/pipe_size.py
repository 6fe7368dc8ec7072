"""How much a slot's frame pipes hold: a large task or result crosses in one write, not in 64 KiB
steps.

Linux gives a pipe 64 KiB. A 1 MB task written to a slot then takes 16 rounds of the daemon's
loop writing 64 KiB and the slot waking to read it (and the same for its result the other way),
with the unsent rest copied into the write transport's buffer first. Each slot pipe is widened
to :data:`SLOT_PIPE_BYTES` (Linux's default ``/proc/sys/fs/pipe-max-size``); the kernel takes
pages only for bytes actually in the pipe, so an idle or small-task pipe costs no more memory. A
pipe that cannot be widened (another limit, not Linux) keeps its size: slower for large
payloads, never wrong.

Linux counts every pipe's capacity against its user: past ``pipe-user-pages-soft`` (64 MiB by
default) each new pipe of that user, in any process, gets 8 KiB. So a daemon's slot pipes
together hold at most :data:`SLOTS_SHARE` (a quarter of that default): 1 MiB each up to 8
slots, less with more slots (:func:`pipe_bytes_for`), never less than Linux's 64 KiB.
"""

from __future__ import annotations

import fcntl
import logging
from typing import Final

log = logging.getLogger(__name__)

SLOT_PIPE_BYTES: Final = 1024 * 1024
"""The most a slot pipe holds."""
SLOTS_SHARE: Final = 16 * 1024 * 1024
"""The most all of a daemon's slot pipes hold together (two per slot)."""
DEFAULT_PIPE_BYTES: Final = 64 * 1024
"""What Linux gives a pipe: a slot pipe is never made smaller."""


def pipe_bytes_for(slots: int) -> int:
    """The capacity of each slot pipe of a daemon of ``slots`` slots: a power of two between
    :data:`DEFAULT_PIPE_BYTES` and :data:`SLOT_PIPE_BYTES`, within :data:`SLOTS_SHARE` in all."""
    size = SLOT_PIPE_BYTES
    while size > DEFAULT_PIPE_BYTES and 2 * max(1, slots) * size > SLOTS_SHARE:
        size //= 2
    return size


def widen(fd: int, size: int = SLOT_PIPE_BYTES) -> int | None:
    """Sets the capacity of pipe ``fd`` to ``size`` bytes (none below Linux's own); the capacity
    it has now (None: unknown, the platform cannot say)."""
    setter = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setter is None:  # not Linux
        return None
    if size <= DEFAULT_PIPE_BYTES:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    try:
        capacity: int = fcntl.fcntl(fd, setter, size)
    except OSError as exc:  # over a limit: the pipe keeps its size
        log.debug("daemon.slot.pipe_not_widened", extra={"size": size, "error": str(exc)})
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    return capacity
