"""Per-key order of a job's tasks: the key's check and the chains of tasks waiting their turn.

``submit(payload, key="bot-42")``: tasks of one key run one at a time, in submission order;
tasks of different keys run in parallel. The client sequences them (see docs/client.md, "Tasks
in order per key", for why here and not in the brokers): it keeps, per key, a FIFO of the
key's tasks whose outcome has not come yet (its *chain*); only the head of each chain is out at
the brokers, and the next one is sent once the head's outcome came. The others are *held*: in
the journal, and no demand for slots.

This module is the bookkeeping only (no I/O): :class:`KeyChains`. The sending is
:class:`~truba.client.key_order.KeyOrder`'s.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Final, final

from truba.client.errors import InvalidArgument

MAX_KEY_BYTES: Final = 256
"""The longest key, in bytes of UTF-8."""


def check_key(key: object) -> str:
    """``key`` if it is a usable order key: a non-empty ``str`` of at most
    :data:`MAX_KEY_BYTES` bytes in UTF-8.

    Raises:
        InvalidArgument: anything else (nothing is recorded or sent).
    """
    if not isinstance(key, str):
        raise InvalidArgument("INVALID_ARGUMENT", f"key: must be a str, got {type(key).__name__}")
    try:
        size = len(key.encode())
    except UnicodeEncodeError as exc:
        raise InvalidArgument("INVALID_ARGUMENT", f"key: not encodable as UTF-8 ({exc.reason})") from None
    if not 0 < size <= MAX_KEY_BYTES:
        raise InvalidArgument(
            "INVALID_ARGUMENT", f"key: must be 1 to {MAX_KEY_BYTES} bytes in UTF-8, got {size}"
        )
    return key


@final
class KeyChains:
    """Per key, the ids of its tasks whose outcome has not come, oldest first; the first (the
    *head*) is the only one sent. Memory: an id and a dict entry per keyed task."""

    def __init__(self) -> None:
        self._chains: dict[str, collections.deque[str]] = {}
        self._key_of: dict[str, str] = {}
        """Every chained task's key."""

    def __len__(self) -> int:
        """Keyed tasks whose outcome has not come (heads and held)."""
        return len(self._key_of)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._key_of

    @property
    def held(self) -> int:
        """Tasks waiting for an earlier task of their key (every chained task but the heads)."""
        return len(self._key_of) - len(self._chains)

    def is_held(self, task_id: str) -> bool:
        """True if ``task_id`` waits for an earlier task of its key (it must not be sent)."""
        key = self._key_of.get(task_id)
        return key is not None and self._chains[key][0] != task_id

    def add(self, key: str, task_id: str) -> bool:
        """Chains a new task at the end of its key's chain; True if it is the head (send it)."""
        self._key_of[task_id] = key
        chain = self._chains.get(key)
        if chain is None:
            self._chains[key] = collections.deque((task_id,))
            return True
        chain.append(task_id)
        return False

    def rebuild(self, tasks: Iterable[tuple[str, str]], sent: set[str]) -> list[str]:
        """Chains a resumed job's ``(task id, key)`` pairs, oldest first, and returns the ones
        whose outcome came before the crash. A task is only sent once the outcome of the one
        before it came, so in each key the tasks older than its newest task in ``sent`` (a
        broker confirmed them) had their outcomes: that newest one is the head."""
        tasks = list(tasks)
        newest = {key: index for index, (task_id, key) in enumerate(tasks) if task_id in sent}
        came = []
        for index, (task_id, key) in enumerate(tasks):
            if index < newest.get(key, -1):
                came.append(task_id)
            else:
                self.add(key, task_id)
        return came

    def end(self, task_id: str) -> str | None:
        """``task_id``'s outcome came (or it was withdrawn): it leaves its chain. Returns the
        task that became its key's head and is to be sent now, if any."""
        key = self._key_of.pop(task_id, None)
        if key is None:
            return None
        chain = self._chains[key]
        was_head = chain[0] == task_id
        if was_head:
            chain.popleft()
        else:  # not a head: nothing to send (a held task is never sent, so never ends this way)
            chain.remove(task_id)
        if not chain:
            del self._chains[key]
            return None
        return chain[0] if was_head else None
