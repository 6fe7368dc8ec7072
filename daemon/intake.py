"""How a runner's workers get their deliveries: one at a time, chunks of short tasks, batches.

Frames (:mod:`truba.pipes.frame`): the members of a task frame are handed to whichever workers
ask, so a frame spreads over the free slots. When tasks are short, a worker takes a few members
at once (a chunk, see :meth:`Intake.take_more`), written to its slot in one go. When members
have waited ``hold_limit`` seconds and no worker has taken a task for as long (every slot is
busy with a long one), they are handed back to the queue, unspent, for another daemon to run
(late binding: a frame of long tasks must not keep one daemon's work from another's idle slots;
members of short tasks keep flowing to this daemon's slots and are not sent around).

A batch handler's worker collects up to ``max_size`` deliveries (:mod:`truba.daemon.batching`).

Over several brokers the prefetch window is split while every slot is busy, and whole again
when a slot finds nothing (:meth:`Intake.take`, :class:`~truba.pipes.prefetch.Window`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from truba.daemon.batching import collect
from truba.daemon.crew import Crew, Worker
from truba.daemon.returns import Returns
from truba.handlers import BatchSpec
from truba.pipes.base import Delivery, Listener
from truba.pipes.errors import PipeClosed, PipeError
from truba.pipes.frame_listener import FrameListener
from truba.pipes.prefetch import Window
from truba.pipes.serialize import DeserializeListener
from truba.wire import TaskMessage

log = logging.getLogger(__name__)
GET_TIMEOUT = 0.5
CHUNK = 32
"""Tasks of a frame a worker hands its slot in one write at most when they are short (see
take_more): one wake-up of the slot process for several tasks instead of one each. A pipe write
that wakes a slot was the daemon's largest single cost per task under W1 (issue 18); 32 instead
of 8 took a quarter of the writes' share off the daemon's CPU per task."""
CHUNK_SECONDS = 0.01
"""A chunk holds no more tasks than run in about this long (at the recent handler time per
task): the tasks of a chunk are bound to its slot, so it stays short."""
CHUNK_BELOW = 0.002
"""Tasks are short when their handler time averages under this (seconds, recent tasks)."""
HOLD_LIMIT = 0.1
"""Seconds members of a frame may wait for a slot of this runner before they go back to the
queue (see the module docstring)."""


class Intake:
    """Hands one runner's deliveries to its workers; see the module docstring."""

    def __init__(
        self,
        job_id: str,
        tasks: Listener[TaskMessage],
        frames: FrameListener | None,
        window: Window,
        crew: Crew,
        returns: Returns,
        *,
        hold_limit: float = HOLD_LIMIT,
    ) -> None:
        self.job_id = job_id
        self.tasks = tasks
        self.window = window
        self.crew = crew
        self.returns = returns
        self.hold_limit = hold_limit
        self.frames = frames
        """The unframe layer of the task listener (None: not a framing stack)."""
        self._at_hand = (
            tasks.take_at_hand if frames is not None and isinstance(tasks, DeserializeListener) else None
        )
        """Takes decoded members of a frame at hand, without a get each (None: the listener
        cannot: not a framing stack, or a test's own listener)."""
        self.idle = 0
        """Workers waiting for a delivery right now."""
        self._took_at = time.monotonic()
        """When a worker last took a task (see _watch_held)."""
        self._holding: asyncio.Task[None] | None = None
        """Hands back frame members that wait too long (started with the first worker)."""
        self._quit_holding = asyncio.Event()
        """Stops that watcher between two hand-backs (cancelling it could cut one in half)."""

    @property
    def holds_members(self) -> bool:
        """Members of a frame are at hand (received, not taken yet)."""
        return self.frames is not None and self.frames.held > 0

    async def take(self, worker: Worker) -> Delivery[TaskMessage] | None:
        """The next delivery, or None on timeout or when the runner wakes this worker."""
        if worker.wake.is_set():
            worker.wake.clear()
            return None
        if self.frames is not None and self.frames.held:
            # Members of a frame at hand: taken at once, without waiting machinery (the common
            # case under load, worth its own path). A member that cannot be decoded is not
            # taken at hand: the get dead-letters it.
            at_hand = self._at_hand(1) if self._at_hand is not None else None
            delivery = at_hand[0] if at_hand else await self.tasks.get(0.0)
            if delivery is not None:
                self._took_at = time.monotonic()
                return delivery
        # The worker waits in its own task (no task of its own for the get, no asyncio.wait: one
        # loop turn less between a delivery's arrival and its slot); a wake cancels that wait.
        # What the cancelled get was bringing stays in the unframe layer (its pull is not
        # cancelled), where the next take finds it.
        current = asyncio.current_task()
        assert current is not None
        woken = False

        def wake() -> None:
            nonlocal woken
            woken = True
            current.cancel()

        forget = worker.wake.on_set(wake)
        self.idle += 1
        try:
            delivery = await self.tasks.get(GET_TIMEOUT)
        except asyncio.CancelledError:
            if not woken or current.uncancel() > 0:  # cancelled from elsewhere (too)
                raise
            delivery = None
        finally:
            self.idle -= 1
            forget()
        woken = woken or worker.wake.is_set()
        worker.wake.clear()
        await self._adapt_window(delivery, woken)
        if delivery is not None:
            self._took_at = time.monotonic()
        return delivery

    async def take_more(self, worker: Worker, task_seconds: float | None) -> list[Delivery[TaskMessage]]:
        """More members of a frame at hand, to run on this worker's slot after the one it took
        (up to :data:`CHUNK` in all, and no more than run in about :data:`CHUNK_SECONDS`): only
        when tasks are short (``task_seconds``: recent
        handler seconds per task, None: none ended yet), and no more than this worker's share of
        what is held, so that a frame still spreads over the free slots."""
        short = task_seconds is not None and task_seconds < CHUNK_BELOW
        if self.frames is None or not short or self.crew.going(worker):
            return []
        assert task_seconds is not None
        size = CHUNK if task_seconds <= CHUNK_SECONDS / CHUNK else max(2, int(CHUNK_SECONDS / task_seconds))
        share = min(size - 1, self.frames.held // (self.idle + 1))
        if share <= 0:
            return []
        if self._at_hand is not None:  # in one call, not a get each
            return self._at_hand(share)
        more: list[Delivery[TaskMessage]] = []
        for _ in range(share):
            delivery = await self.tasks.get(0.0)
            if delivery is None:
                break
            more.append(delivery)
        return more

    async def collect(
        self, worker: Worker, first: Delivery[TaskMessage], spec: BatchSpec
    ) -> list[Delivery[TaskMessage]]:
        """A batch for a batch handler's worker: ``first`` and what else arrives (see
        :func:`~truba.daemon.batching.collect`); cut short when the worker leaves or is
        interrupted."""
        return await collect(self.tasks, first, spec, lambda: self._taken(worker))

    def _taken(self, worker: Worker) -> bool:
        """The worker should stop collecting a batch: it leaves or is being interrupted."""
        return worker.leaving or self.crew.closing or worker.interrupt.is_set()

    async def _adapt_window(self, delivery: Delivery[TaskMessage] | None, woken: bool) -> None:
        """Late binding over several brokers (see :class:`~truba.pipes.prefetch.Window`): with
        every slot busy, split the prefetch so the daemon holds no task it is not running; when
        a slot found nothing, lift the split (the tasks may be on one broker only)."""
        try:
            if delivery is not None and self.idle == 0:
                await self.window.set_split(True)
            elif delivery is None and not woken:
                await self.window.set_split(False)
        except PipeError as exc:  # a leaf went away under the resize: its reopen applies the size
            log.debug("daemon.window.resize_failed", extra={"error": repr(exc)})

    def watch_held(self) -> None:
        """Starts handing back frame members that wait too long (once; framing stacks only)."""
        if self._holding is None and self.frames is not None:
            self._holding = asyncio.create_task(self._watch_held(), name=f"held-{self.job_id}")

    async def stop_watching(self) -> None:
        """Stops that watcher, between two hand-backs."""
        if self._holding is not None:
            self._quit_holding.set()
            await self._holding

    async def _watch_held(self) -> None:
        """Hands back frame members that waited ``hold_limit`` seconds while no worker took a task."""
        frames = self.frames
        assert frames is not None
        crew = self.crew
        while not crew.closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quit_holding.wait(), self.hold_limit / 2)
            if self.idle or self._quit_holding.is_set() or any(not w.busy for w in crew.workers):
                continue  # a worker is free, or about to be (starting its slot, describing)
            if not frames.held:
                try:  # a frame in the prefetch waits here from now on
                    await frames.take_in()
                except PipeError as exc:  # the listener's own reopen deals with it; a worker sees it too
                    log.debug("daemon.job.take_in_failed", extra={"job_id": self.job_id, "error": repr(exc)})
                continue
            if min(frames.held_for(), time.monotonic() - self._took_at) < self.hold_limit:
                continue  # not waiting long, or the slots take tasks: they flow here
            count = 0
            try:
                while frames.held and not self.idle and not crew.closing:
                    delivery = await self.tasks.get(0.0)
                    if delivery is None:
                        break
                    await self.returns.hand_back(delivery, "held")
                    count += 1
            except PipeClosed:
                return
            except PipeError as exc:
                crew.broke(exc)
                log.warning("daemon.job.hand_back_failed", extra={"job_id": self.job_id, "error": repr(exc)})
                return
            if count:
                log.info("daemon.job.handed_back", extra={"job_id": self.job_id, "count": count})
