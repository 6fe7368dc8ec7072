"""A job seen from the client: submit tasks, close, and take one outcome per task.

:class:`Job` is a facade over parts with one job each, sharing the job's journal and its
:class:`~truba.client.lifecycle.JobStatus`:

- :class:`~truba.client.submission.Submission`: journal, send, confirms, resends, and sending
  everything again when a broker lost its data (:class:`~truba.client.watch.LossWatch`);
- :class:`~truba.client.result_stream.ResultStream`: outcomes exactly once (dedup by journal),
  put-back on a consumer's error, ack batching, cancelled outcomes;
- :class:`~truba.client.progress.ProgressReporter`: coalesced progress reports;
- :class:`~truba.client.lifecycle.JobCalls`: the calls to the scheduler, through the JobService
  stub the client hands in (close, finish, cancel, importance, watch, info, running);
- :func:`~truba.client.map.map_outcomes`: ``map``; :func:`~truba.client.callback.deliver`: ``on_result``.

Every task stays in the journal from ``submit`` until the application has taken its outcome, and
a result is acked only after that, so a crash anywhere loses nothing: :meth:`Client.resume` sends
what no broker confirmed and waits for the rest. The facade composes the parts and orders their
shutdown (finish, cancel, detach).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterable, Coroutine, Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, cast

from typing_extensions import TypeVar

from truba.client.call import call_task
from truba.client.callback import OutcomeCallback, deliver
from truba.client.dead_letters import DeadLetters, DeadRetry, read_dead_letters
from truba.client.dispatch import Dispatch, DrainedCallback
from truba.client.encoded import EncodedTask
from truba.client.framing import FrameSizer
from truba.client.group import Group, Groups
from truba.client.group_book import GroupBook
from truba.client.job_ending import DETACH_PATIENCE, JobEnding
from truba.client.journal import TaskJournal
from truba.client.lifecycle import JobCalls, JobStatus
from truba.client.map import MAP_WINDOW, Mappable, map_outcomes
from truba.client.options import check_importance
from truba.client.outcome import Outcome, R
from truba.client.pickled import pickled_payload
from truba.client.progress import ProgressReporter
from truba.client.reach import Reach
from truba.client.result_stream import ResultStream
from truba.client.running import RunningTasks
from truba.client.submission import Submission
from truba.pipes.base import Sender
from truba.pipes.broker import Broker
from truba.pipes.stacks import ListenStack
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger(__name__)
P = TypeVar("P", default=Any)
"""The payload the job's handler takes (Any for a handler given by name)."""


class Job(Generic[P, R]):
    """One job: ``submit`` tasks, ``close`` it, iterate its ``results()``.

    Typed by its handler when created from a function: ``Job[P, R]`` takes payloads of type P,
    and ``Outcome[R].result()`` is an R (mypy checks both).

    Not safe to share between event loops; use one ``results()``/``on_result`` consumer.
    """

    def __init__(
        self,
        jobs: jobs_pb2_grpc.JobServiceAsyncStub,
        info: jobs_pb2.Job,
        tasks: Sender[EncodedTask],
        results: ListenStack[Outcome],
        journal: TaskJournal,
        *,
        links: Sequence[Broker],
        marker: str,
        max_payload: int,
        reach: Reach,
        resumed: bool = False,
        sizer: FrameSizer | None = None,
    ) -> None:
        self._journal = journal
        self._pickle = info.settings.codec == "pickle"
        """Payloads are pickled (``codec="pickle"``); results are unpickled by the result codec."""
        self._status = JobStatus.of(info)
        self._consumer: asyncio.Task[None] | None = None
        self._calls = JobCalls(jobs, info, reach=reach)
        self._jobs = jobs
        self._progress = ProgressReporter(jobs, info.id, self._counts)
        self._submission = Submission(
            info.id,
            tasks,
            journal,
            self._status,
            links=links,
            marker=marker,
            resumed=resumed,
            priorities=info.settings.priorities,
            max_payload=max_payload,
            on_change=self._progress.poke,
            reach=reach,
        )
        self._stream = ResultStream(
            info.id,
            results.listener,
            journal,
            self._status,
            frames=results.frames,
            sizer=sizer,
            on_taken=self._taken,
            poll=lambda: self._ending.check_state(),
            on_done=lambda: self._ending.finish(),
            reach=reach,
            latency=self._progress.latency,
        )
        keys = self._submission.keys
        keys.on_active = lambda: self._stream.tell(keys.arrived, keys.settled)
        self._dispatch = Dispatch(info.id, self._stream, journal, self._status)
        self._groups = Groups(GroupBook(journal.directory), self._submit_claimed, self._dispatch.pump)
        self._dispatch.claims.append(self._groups.claim)
        self._dispatch.waiting = self._groups.waiting
        self._ending = JobEnding(
            info.id,
            journal,
            self._status,
            self._progress,
            self._submission,
            self._stream,
            self._calls,
            self._groups,
        )

    async def __aenter__(self) -> Job:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """``async with await client.create_job(...) as job:`` closes the job after the block
        (no more tasks), cancels it if the block raised an Exception (it would be left half
        submitted), and leaves it running and resumable on KeyboardInterrupt, cancellation, or
        an unreachable cluster (Unavailable): then it is the user's to resume or cancel."""
        await self._ending.leave_block(exc_type, exc, self.close)

    async def cancel_quietly(self, cause: BaseException | None) -> None:
        """Cancels the job because of ``cause`` (raised on to the caller); a cancel that fails
        is logged and the job left running, resumable, so that ``cause`` is what the caller sees."""
        await self._ending.cancel_quietly(cause)

    async def _start(self) -> None:
        """Sends what no broker confirmed (a resumed job), and starts watching for lost brokers."""
        await self._submission.start()
        self._dispatch.pump()  # a resumed job's groups wait for their outcomes

    def _taken(self) -> None:
        self._progress.poke()
        self._dispatch.taken()

    @property
    def id(self) -> str:
        """The job's id, as the scheduler knows it."""
        return self._calls.info.id

    @property
    def handler(self) -> str:
        """The job's handler, ``"package.module:function"``."""
        return self._calls.info.handler

    @property
    def submitted(self) -> int:
        """Tasks submitted so far (by every run of this client on the job's journal)."""
        return self._journal.recorded

    @property
    def received(self) -> int:
        """Outcomes taken so far (by every run on this journal)."""
        return self._journal.recorded - len(self._journal)

    @property
    def outstanding(self) -> int:
        """Tasks submitted whose outcome has not been taken yet."""
        return len(self._journal)

    @property
    def done(self) -> bool:
        """Closed, and every submitted task has its outcome."""
        return self._status.closed and len(self._journal) == 0

    @property
    def ended(self) -> bool:
        """Finished, cancelled or detached: this object has no more work to do."""
        return self._ending.ended

    @property
    def journal_path(self) -> str | None:
        """Where the job's tasks wait for their outcomes on disk (None: memory only)."""
        return None if self._journal.directory is None else str(self._journal.directory)

    def _counts(self) -> tuple[int, int, int]:  # held keyed tasks: no demand yet, like delayed ones
        return self.submitted, self.received, self._submission.delayed.pending() + self._submission.keys.held

    def submit(
        self,
        payload: P,
        *,
        priority: int | None = None,
        timeout: float | None = None,
        delay: float | None = None,
        not_before: datetime | None = None,
        key: str | None = None,
    ) -> Coroutine[Any, Any, str]:
        """Sends one task; returns (awaited) its id once a broker accepted it for sending.

        The task is in the journal before it is sent and stays there until its outcome is
        taken. ``submit`` waits while the brokers are slow or blocked (each broker takes at
        most the client's ``max_unconfirmed`` unconfirmed tasks), so memory stays bounded.

        A delayed task (``delay`` or ``not_before``) is held by the brokers until it is due
        (±1 s; no consumer holds it meanwhile), survives a broker restart, and keeps the job
        open: ``close()`` and ``results()`` end only once its outcome is in.

        Tasks of one ``key`` run one at a time, in submission order; a task waits (*held*, in the
        journal, ``submit`` returns) until its key's previous outcome came (truba.client.key_order).

        Args:
            priority: 0 (the default) to 9, higher taken first; only for a job created with
                ``priorities=True``.
            timeout: seconds to wait for a broker to take the task (None: as long as it takes).
            delay: seconds to wait before the task may run (delays of days are fine).
            not_before: the earliest time the task may run: an aware datetime (a naive one is
                refused); one in the past means now.
            key: the task's order key: a non-empty ``str`` of at most 256 bytes in UTF-8.

        Raises:
            InvalidArgument: a bad ``key`` (nothing recorded or sent).
            ValueError: a priority on a job without priorities, or out of range; both ``delay``
                and ``not_before``, a negative delay, a naive ``not_before``, or a due time
                over the longest delay (13 years) (nothing sent).
            PipeClosed: the job was closed.
            CodecError: ``payload`` is not msgpack-serializable (nothing sent).
            MessageTooLarge: ``payload`` is over the client's ``max_payload`` (nothing sent).
            SubmitTimeout: no broker took it within ``timeout`` (it was not submitted).
            SpoolFull, SpoolError: the journal could not write it (nothing sent).
            PipeBroken: no broker can take the task (it was not submitted).
        """
        # The submission's coroutine itself, not one awaiting it: no extra frame per task.
        sent = pickled_payload(payload) if self._pickle else payload
        return self._submission.submit(
            sent, priority=priority, timeout=timeout, delay=delay, not_before=not_before, key=key
        )

    def _submit_claimed(self, payload: P, **options: Any) -> Coroutine[Any, Any, str]:
        """``submit`` for a task whose outcome a call or a group claims once it returns: at once,
        not after the task left (see :meth:`Submission.submit`), so the claim is in place before
        any outcome can be read."""
        sent = pickled_payload(payload) if self._pickle else payload
        return self._submission.submit(sent, leave_first=False, **options)

    async def close(self) -> None:
        """No more tasks: waits until brokers confirmed every task, then tells the scheduler."""
        if self._status.closed:
            return
        await self._submission.confirm_all()
        self._status.closed = True
        await self._calls.close(self.submitted)
        log.info("client.job.closed", extra={"job_id": self.id, "submitted": self.submitted})
        # The task pipe stays open: a broker found lost later gets its tasks sent again.
        if not len(self._journal):  # every outcome taken already (by calls, groups): no stream to end it
            await self._ending.finish()

    def results(self) -> AsyncGenerator[Outcome[R], None]:
        """Yields one outcome per task, in arrival order, until the job is done.

        An outcome counts as taken when the consumer asks for the next one (or ends the loop
        normally): only then does the journal forget its task. Results are acked in batches
        once their outcomes are taken and forgotten on disk: when no more are at hand, after
        :data:`~truba.client.result_stream.ACK_BATCH` of them, and when the iteration ends.
        A consumer that stops at an outcome by raising, or by closing the iterator, puts that
        outcome back: it comes again, here or after :meth:`Client.resume`. Ends when the job is
        closed and every submitted task has its outcome; the scheduler then deletes the job's
        queues.

        If the job is cancelled (here or by another client), every task without an outcome
        gets a cancelled one (:attr:`Outcome.cancelled`) and the iteration ends.
        """
        return self._stream.outcomes()

    def on_result(self, callback: OutcomeCallback) -> asyncio.Task[None]:
        """Calls ``callback`` for every outcome in the background; returns that task.

        If the callback raises, its outcome is not taken: it is put back (it comes again to the
        next consumer, or after :meth:`Client.resume`), the consumer stops and :meth:`wait`
        raises :class:`CallbackFailed` (with the callback's error as its cause). Call
        ``on_result`` again to go on.
        """
        consumer = deliver(self.results(), callback, job_id=self.id)
        self._consumer = asyncio.create_task(consumer, name=f"on-result-{self.id}")
        return self._consumer

    async def wait(self) -> None:
        """Waits until the ``on_result`` consumer has delivered every outcome.

        Raises:
            CallbackFailed: the callback raised (its outcome was put back).
        """
        if self._consumer is None:
            raise RuntimeError("wait() needs on_result(); iterate results() otherwise")
        await self._consumer

    def map(
        self,
        payloads: Iterable[P] | AsyncIterable[P],
        *,
        ordered: bool = True,
        window: int = MAP_WINDOW,
        progress: bool | None = None,
    ) -> AsyncGenerator[Outcome[R], None]:
        """Submits every payload, closes the job, and yields one outcome per payload; see
        :func:`~truba.client.map.map_outcomes`."""
        mappable = cast(Mappable, self)  # submits payloads of type P only, which map passes through
        return map_outcomes(mappable, payloads, ordered=ordered, window=window, progress=progress)

    async def call(
        self, payload: P, *, priority: int | None = None, timeout: float | None = None, key: str | None = None
    ) -> R:
        """Submits one task and returns its result, or raises its error (``TaskFailed``,
        ``TaskGaveUp``, ``TaskCancelled``); many calls may wait at once (truba.client.call).
        With ``key``, it runs after its key's earlier tasks (see ``submit``); ``timeout`` counts them too.

        Raises:
            CallTimeout: no outcome within ``timeout`` seconds; the task goes on, and its
                outcome goes to ``results()``/``on_result`` once.
        """
        outcome = await call_task(
            self._dispatch, lambda: self._submit_claimed(payload, priority=priority, key=key), timeout
        )
        return cast(R, outcome.result())

    def group(self, name: str | None = None) -> Group[R]:
        """A group of this job's tasks that completes as one (truba.client.group): a new one, or
        the one called ``name`` (found again after a resume)."""
        return self._groups.group(name)

    def groups(self) -> list[Group[R]]:
        """The job's groups, open or done (after a resume: those its journal has)."""
        return self._groups.all()

    def on_drained(self, callback: DrainedCallback) -> None:
        """Calls ``callback()`` whenever the job drains: open, and every task submitted has its
        outcome taken; again each time it drains after more submissions."""
        self._dispatch.on_drained(callback)

    async def cancel(self) -> None:
        """Cancels the job: the scheduler deletes its queues, and every task without an outcome
        yet gets a cancelled one (``results()`` yields them, then ends).

        This client stops using the job's queues first, so that none of its pipes declares
        them again after the scheduler deleted them. If the scheduler cannot be told (the
        error is raised), the journal is kept: call ``cancel()`` again.
        """
        await self._ending.cancel()

    async def detach(self, patience: float = DETACH_PATIENCE) -> None:
        """Stops this client's work on the job and leaves it to :meth:`Client.resume`: the
        journal keeps every task without an outcome; the job goes on in the cluster. Idempotent.

        Outcomes taken are acked, and confirms awaited are waited for, ``patience`` seconds at
        most: a confirm not in by then only means :meth:`Client.resume` sends the task again.
        """
        await self._ending.detach(patience)

    async def set_importance(self, importance: float) -> None:
        """Changes the job's weight in the fair share; slots move at once.

        Raises:
            InvalidArgument: not a number > 0. FailedPrecondition: the job ended.
        """
        await self._calls.set_importance(check_importance(importance))

    def watch(self) -> AsyncGenerator[jobs_pb2.JobEvent, None]:
        """The job as the scheduler sees it now, then on every change (state, slots,
        importance, progress) until it ends. Slow readers see changes coalesced, never stale."""
        return self._calls.watch()

    async def info(self) -> jobs_pb2.Job:
        """The scheduler's current view of the job."""
        return await self._calls.get()

    async def running(self) -> RunningTasks:
        """The job's tasks running now: daemon, slot, attempt, since when (truba.client.running)."""
        return await self._calls.running()

    async def dead_letters(self, *, limit: int = 0, bodies: bool = False) -> DeadLetters:
        """The job's given-up, poison and refused tasks, also after it ends (truba.client.dead_letters)."""
        return await read_dead_letters(self._jobs, self.id, limit=limit, bodies=bodies)

    async def retry_dead(self) -> dict[str, str]:
        """Sends the dead tasks again as new tasks, each with a fresh outcome; ``{old id: new id}``."""
        return await DeadRetry(
            self._jobs,
            self.id,
            self._status,
            # a dead letter's payload is one this job took before: a P
            lambda t: self.submit(cast(P, t.payload), priority=t.priority or None),
        ).retry()
