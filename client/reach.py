"""How long the client waits for an unreachable cluster: every wait that needs the scheduler or a
broker ends within ``unavailable_after`` seconds with :class:`~truba.client.errors.Unavailable`.

One :class:`Reach` per client, shared by its jobs:

- **The scheduler.** :meth:`Reach.call` makes one JobService call, each try bounded by what is
  left of the patience; an unreachable scheduler (``UNAVAILABLE``, or no answer in time for a
  call safe to repeat) is tried again with :data:`CALL_BACKOFF` until the patience runs out.
  While an election is under way (a standby answered within
  :data:`~truba.follow.ELECTION_WINDOW` seconds) a try waits
  :data:`~truba.follow.STANDBY_RETRY` instead: the new leader serves within seconds, and a grown
  backoff would keep the call away for up to 5 s after.
- **The brokers.** The jobs' loss watches report each check of a broker
  (:meth:`Reach.broker_up`, :meth:`Reach.broker_down`); while *every* broker is down, waits in
  :meth:`Reach.bounded` blocks (a submit, the confirms at close) and the result stream's
  :meth:`Reach.check_brokers` end with Unavailable once the outage is older than the patience.
  A broker still reachable keeps everything going: the pipes route around the others.

Each outage is told once when it begins and once when it ends (:func:`~truba.client.notices.notice`),
never per try.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Final, TypeVar, final

import grpc

from truba.backoff import Backoff
from truba.client.errors import Unavailable, map_rpc_errors
from truba.client.notices import notice
from truba.follow import STANDBY_RETRY, Election

log = logging.getLogger(__name__)

T = TypeVar("T")

UNAVAILABLE_AFTER: Final = 60.0
"""Seconds the client waits, by default, for an unreachable scheduler or brokers."""
CALL_BACKOFF: Final = Backoff(attempts=None, base=0.2, cap=5.0)
"""Waits between tries of a call while the scheduler is unreachable."""
ONCE_TIMEOUT: Final = 5.0
"""Seconds a call tried once (:meth:`Reach.call_once`) waits for its answer at most."""


@final
class Reach:
    """Bounds the client's waits on an unreachable cluster; see the module."""

    def __init__(
        self,
        patience: float = UNAVAILABLE_AFTER,
        *,
        scheduler: str = "",
        backoff: Backoff = CALL_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        electing: Callable[[], bool] = lambda: False,
    ) -> None:
        """``electing`` says whether the channel saw a standby's answer lately (a
        :class:`~truba.follow.FollowingChannel` over several addresses knows; one address alone
        answers for itself)."""
        if not patience > 0:
            raise ValueError(f"unavailable_after: must be > 0 seconds, got {patience}")
        self.patience = patience
        self._scheduler = scheduler
        self._backoff = backoff
        self.clock = clock
        """The clock of outages (``time.monotonic``, or a test's)."""
        self._electing = electing
        self._election = Election(clock)
        """Standbys that answered this client's calls."""
        self._scheduler_down = False
        self._down: dict[str, float] = {}
        """Brokers whose last check failed, and since when."""
        self._up: set[str] = set()
        self._outage: float | None = None
        """Since when every broker is down (None: at least one is up, or none was checked)."""
        self._guards: set[BrokerWait] = set()
        """The broker waits under way (:meth:`bounded`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the last broker wait ran on: ``current_task(loop)`` without asking for the
        running loop (a ``getpid`` system call each time) on every submit."""
        self._watchers: collections.Counter[str] = collections.Counter()
        """Loss watches checking each broker."""

    # -- the scheduler ---------------------------------------------------------------------------

    async def call(self, what: str, rpc: Callable[[float], Awaitable[T]], *, repeatable: bool = True) -> T:
        """``rpc(timeout)`` (a JobService call), tried again while the scheduler is unreachable.

        ``repeatable`` says whether a call that got no answer in time may be made again (it may
        have been served): a CreateJob is not.

        Raises:
            Unavailable: no answer within the patience.
            SchedulerError: the scheduler's refusal, at once.
        """
        deadline = self.clock() + self.patience
        attempt = 0
        while True:
            left = deadline - self.clock()
            try:
                with map_rpc_errors():
                    result = await rpc(max(left, 0.001))
            except Unavailable as exc:
                timed_out = exc.code == grpc.StatusCode.DEADLINE_EXCEEDED.name
                self.scheduler_down(what, exc)
                self._election.saw(exc.__cause__)
                if self._electing() or self._election.on:
                    delay = self._backoff.rng(*STANDBY_RETRY)
                else:
                    delay = self._backoff.delay(attempt)
                if (timed_out and not repeatable) or self.clock() + delay >= deadline:
                    raise Unavailable(
                        "UNAVAILABLE",
                        f"{what}: the scheduler at {self._scheduler} did not answer within "
                        f"{self.patience:g} s ({exc.details})",
                    ) from exc
                await self._backoff.sleep(delay)
                attempt += 1
                continue
            self.scheduler_up()
            return result

    async def call_once(self, what: str, rpc: Callable[[float], Awaitable[T]]) -> T:
        """``rpc(timeout)`` tried once, for at most :data:`ONCE_TIMEOUT` seconds (a poll that
        comes again anyway); an unreachable scheduler is still told once per outage.

        Raises:
            Unavailable: no answer; SchedulerError: the scheduler's refusal.
        """
        try:
            with map_rpc_errors():
                result = await rpc(min(self.patience, ONCE_TIMEOUT))
        except Unavailable as exc:
            self.scheduler_down(what, exc)
            raise
        self.scheduler_up()
        return result

    def scheduler_down(self, what: str, exc: BaseException) -> None:
        """A call found the scheduler unreachable (told once per outage)."""
        log.debug("client.scheduler.call_failed", extra={"call": what, "error": str(exc)})
        if not self._scheduler_down:
            self._scheduler_down = True
            notice(
                log,
                "client.scheduler.unreachable",
                f"the scheduler at {self._scheduler} is unreachable; waiting for it "
                f"(calls that need it give up after {self.patience:g} s)",
                scheduler=self._scheduler,
                error=str(exc),
            )

    def scheduler_up(self) -> None:
        """A call was answered."""
        if self._scheduler_down:
            self._scheduler_down = False
            notice(
                log,
                "client.scheduler.reachable",
                f"the scheduler at {self._scheduler} answers again",
                level=logging.INFO,
                scheduler=self._scheduler,
            )

    # -- the brokers -----------------------------------------------------------------------------

    def watch(self, urls: Iterable[str]) -> None:
        """A job's loss watch checks these brokers from now on (see :meth:`unwatch`)."""
        self._watchers.update(urls)

    def unwatch(self, urls: Iterable[str]) -> None:
        """A loss watch stopped: a broker no watch checks any more counts neither up nor down."""
        self._watchers.subtract(urls)
        for url in [url for url, count in self._watchers.items() if count <= 0]:
            del self._watchers[url]
            self._down.pop(url, None)
            self._up.discard(url)

    def broker_up(self, url: str) -> None:
        """A check reached the broker at ``url``."""
        self._down.pop(url, None)
        self._up.add(url)
        if self._outage is not None:
            self._outage = None
            notice(log, "client.brokers.reachable", "a broker is reachable again", level=logging.INFO)
            for guard in self._guards:
                guard.reschedule(None)

    def broker_down(self, url: str, error: BaseException, *, since: float | None = None) -> None:
        """A check (begun at ``since``) could not reach the broker at ``url``."""
        began = self.clock() if since is None else since
        self._down.setdefault(url, began)
        self._up.discard(url)
        if self._outage is None and not self._up:
            self._outage = began  # the last broker up went down: the outage begins
            notice(
                log,
                "client.brokers.unreachable",
                f"no broker is reachable ({type(error).__name__}: {error}); waiting for one "
                f"(waits that need one give up after {self.patience:g} s)",
                brokers=len(self._down),
            )
            if self._guards:
                deadline = self._loop_deadline()
                for guard in self._guards:
                    guard.reschedule(deadline)

    @property
    def brokers_out(self) -> bool:
        """Every broker has been unreachable for longer than the patience."""
        return self._outage is not None and self.clock() - self._outage >= self.patience

    def check_brokers(self, what: str) -> None:
        """Raises Unavailable if every broker has been unreachable for longer than the patience."""
        if self.brokers_out:
            raise self._brokers_unavailable(what)

    def bounded(self, what: str) -> BrokerWait:
        """``async with reach.bounded("submit"):`` a wait that ends with Unavailable once every
        broker has been unreachable for longer than the patience (a plain ``with`` in a task
        does the same)."""
        return BrokerWait(self, what)

    def _loop_deadline(self) -> float | None:
        if self._outage is None:
            return None
        return asyncio.get_running_loop().time() + self.patience - (self.clock() - self._outage)

    def _brokers_unavailable(self, what: str) -> Unavailable:
        return Unavailable(
            "UNAVAILABLE", f"{what}: no broker has been reachable for {self.patience:g} s or more"
        )


@final
class BrokerWait:
    """The context manager of :meth:`Reach.bounded`: the wait's task is cancelled (and the
    cancellation raised as Unavailable) at the outage's deadline, as ``asyncio.timeout`` would,
    but with no timer and no Timeout object while a broker is up: a submit enters one per task,
    and an outage is the rare case. :meth:`Reach.broker_down` arms the timer of the waits under
    way (:meth:`reschedule`), :meth:`Reach.broker_up` disarms it."""

    __slots__ = ("_cancelling", "_expired", "_handle", "_reach", "_task", "_what")

    def __init__(self, reach: Reach, what: str) -> None:
        self._reach = reach
        self._what = what
        self._handle: asyncio.Handle | None = None
        self._expired = False

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __enter__(self) -> None:
        """Also a plain ``with`` inside a task: entering and leaving wait on nothing, and the hot
        path (a submit per task) then makes no coroutine for either."""
        reach = self._reach
        reach.check_brokers(self._what)
        loop = reach._loop
        # None on another loop than the last one (or none yet): then ask for the running one.
        task = None if loop is None else asyncio.current_task(loop)
        if task is None:
            loop = reach._loop = asyncio.get_running_loop()
            task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("Reach.bounded() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if reach._outage is not None:
            self.reschedule(reach._loop_deadline())
        reach._guards.add(self)

    def reschedule(self, deadline: float | None) -> None:
        """Ends the wait at ``deadline`` (loop time; None: not at all), unless it expired already."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if deadline is None or self._expired:
            return
        loop = self._task.get_loop()
        if deadline <= loop.time():
            self._handle = loop.call_soon(self._expire)
        else:
            self._handle = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._handle = None
        self._expired = True
        self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._reach._guards.discard(self)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise self._reach._brokers_unavailable(self._what) from None
