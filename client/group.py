"""Groups of a job's tasks that complete as one (seed 004's FINI with a completion notice).

``group = job.group()``; ``await group.submit(...)`` (an ordinary task of the job);
``await group.close()`` (no more members); ``await group.wait()`` (every member's outcome,
failures inside, in submission order); ``group.on_done(callback)`` (called once with them).
A member's outcome goes to its group, not to ``results()``/``on_result``: the dispatcher
(:mod:`truba.client.dispatch`) routes it here, and it is written to the group's log
(:mod:`truba.client.group_book`) before it is taken. A resumed client reads the logs back: the
open groups come again under their names (``job.group(name)``, ``job.groups()``), with the outcomes
they had, and a callback that returned before the crash does not fire again. One that had not
(the client died before or during it) fires once ``on_done`` is given again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Generic, final

from truba.client.group_book import NAME, GroupBook, GroupState
from truba.client.outcome import Outcome, R
from truba.errors import TrubaError

log = logging.getLogger(__name__)

GroupCallback = Callable[[list[Outcome[Any]]], Awaitable[None] | None]
"""Called with the group's outcomes once it is done; may be a coroutine function."""
Submit = Callable[..., Awaitable[str]]
"""The job's ``submit``."""
SETTLE_SECONDS: Final = 60.0
"""Seconds a finishing job waits at most for group callbacks still running."""


class GroupClosed(TrubaError):
    """``group.submit`` on a group that was closed: the task was not submitted."""


@final
class Group(Generic[R]):
    """A set of a job's tasks with one completion; see the module."""

    def __init__(
        self, state: GroupState, book: GroupBook, submit: Submit, on_member: Callable[[str, Group[Any]], None]
    ) -> None:
        self._state = state
        self._book = book
        self._submit = submit
        self._on_member = on_member
        self._done = asyncio.Event()
        self._callbacks: list[GroupCallback] = []
        self._firing: asyncio.Task[None] | None = None
        self._check()

    @property
    def name(self) -> str:
        """The group's name (its log's name in the job's journal folder)."""
        return self._state.name

    @property
    def size(self) -> int:
        """Tasks submitted into the group so far."""
        return len(self._state.members)

    @property
    def closed(self) -> bool:
        """No more tasks may join."""
        return self._state.closed

    @property
    def done(self) -> bool:
        """Closed, and every member has its outcome."""
        return self._done.is_set()

    @property
    def pending(self) -> list[str]:
        """Members without an outcome yet."""
        return [t for t in self._state.members if t not in self._state.outcomes]

    async def submit(self, payload: Any, **options: Any) -> str:
        """Submits one task of the job into the group (``options`` as for ``job.submit``).

        Raises:
            GroupClosed: the group was closed (nothing sent); else as ``job.submit``.
        """
        if self._state.closed:
            raise GroupClosed(f"group {self.name} is closed: no more tasks")
        task_id = await self._submit(payload, **options)
        self._state.members.append(task_id)
        self._book.append(self.name, ("task", task_id))
        self._on_member(task_id, self)
        return task_id

    async def close(self) -> None:
        """No more tasks: the group is done once every member has its outcome. Idempotent."""
        if self._state.closed:
            return
        self._state.closed = True
        self._book.append(self.name, ("closed",), sync=True)
        self._check()

    async def wait(self, timeout: float | None = None) -> list[Outcome[R]]:
        """Every member's outcome, in submission order, once the group is closed and done.

        Raises:
            TimeoutError: not done within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            await self._done.wait()
        return self.outcomes()

    def outcomes(self) -> list[Outcome[R]]:
        """The members' outcomes so far, in submission order."""
        got = self._state.outcomes
        return [got[t] for t in self._state.members if t in got]

    def on_done(self, callback: GroupCallback) -> None:
        """Calls ``callback(outcomes)`` once when the group is done (at once if it is done and no
        callback fired yet). Once it returned, it never fires again, also after a resume; if it
        raised, or the client died before it returned, it fires again when given again."""
        self._callbacks.append(callback)
        self._check()

    # -- the dispatcher's side -----------------------------------------------------------------

    def took(self, outcome: Outcome) -> bool:
        """A member's outcome came (the dispatcher): written, then the journal may forget it.
        False if the group had it already (it came again after a crash)."""
        if outcome.task_id in self._state.outcomes:
            return False
        self._book.append(self.name, ("outcome", outcome))
        self._state.outcomes[outcome.task_id] = outcome
        self._check()
        return True

    def _check(self) -> None:
        state = self._state
        if not state.closed or len(state.outcomes) < len(state.members):  # task ids are unique
            return
        if not self._done.is_set():
            self._done.set()
            log.info("client.group.done", extra={"group": self.name, "outcomes": len(state.outcomes)})
        if self._callbacks and not state.fired and self._firing is None:
            self._firing = asyncio.create_task(self._fire(), name=f"group-{self.name}")

    async def _fire(self) -> None:
        outcomes: list[Outcome[Any]] = list(self.outcomes())
        try:
            for callback in self._callbacks:
                maybe = callback(outcomes)
                if maybe is not None:
                    await maybe
        except Exception:
            log.exception("client.group.callback_failed", extra={"group": self.name})
            self._callbacks.clear()
            self._firing = None
            return
        self._state.fired = True
        self._book.append(self.name, ("fired",), sync=True)
        log.info("client.group.fired", extra={"group": self.name})

    async def settled(self) -> None:
        """Waits for a callback still running."""
        if self._firing is not None:
            await asyncio.shield(self._firing)


@final
class Groups:
    """A job's groups: made, found again after a resume, and routed to (see the module)."""

    def __init__(self, book: GroupBook, submit: Submit, pump: Callable[[], None]) -> None:
        self._book = book
        self._submit = submit
        self._pump = pump
        self._groups: dict[str, Group[Any]] = {}
        self._members: dict[str, Group[Any]] = {}
        """Members whose outcome is still to be taken here, by task (their group's log may have
        it already: a crash after writing it and before the journal forgot the task)."""
        self._pending = 0
        """Members without an outcome in their group."""
        self._names = itertools.count(1)
        for state in book.load():
            self._add(state)

    def _add(self, state: GroupState) -> Group[Any]:
        group: Group[Any] = Group(state, self._book, self._submit, self._joined)
        self._groups[state.name] = group
        for task_id in state.members:
            self._members[task_id] = group
        self._pending += len(group.pending)
        return group

    def _joined(self, task_id: str, group: Group[Any]) -> None:
        self._members[task_id] = group
        self._pending += 1
        self._pump()

    def group(self, name: str | None = None) -> Group[Any]:
        """The group called ``name`` (a new one if there is none; a fresh name if None).

        Raises:
            ValueError: ``name`` cannot name a file (letters, digits, ``_.-``, 64 at most).
        """
        if name is None:
            name = next(n for i in self._names if (n := f"g{i}") not in self._groups)
        elif not NAME.fullmatch(name):
            raise ValueError(f"group name {name!r}: letters, digits, '_', '.', '-' (64 at most)")
        group = self._groups.get(name)
        return group if group is not None else self._add(GroupState(name))

    def all(self) -> list[Group[Any]]:
        """Every group of the job, open or done, in name order."""
        return [self._groups[name] for name in sorted(self._groups)]

    def claim(self, outcome: Outcome) -> bool:
        """The dispatcher's router: True if ``outcome`` is a group member's (taken here)."""
        group = self._members.pop(outcome.task_id, None)
        if group is None:
            return False
        if group.took(outcome):
            self._pending -= 1
        return True  # taken again if its group had it already (the journal had not forgotten it)

    def waiting(self) -> bool:
        """Some group member still waits for its outcome."""
        return self._pending > 0

    async def settled(self) -> None:
        """Waits (:data:`SETTLE_SECONDS` at most) for group callbacks still running."""
        try:
            async with asyncio.timeout(SETTLE_SECONDS):
                for group in self._groups.values():
                    await group.settled()
        except TimeoutError:
            log.warning("client.groups.unsettled", extra={"seconds": SETTLE_SECONDS})
