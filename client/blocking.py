"""The blocking facade: the same verbs as :class:`~truba.client.Client`, for code without asyncio.

::

    with truba.connect("localhost:50051") as client:
        for outcome in client.create_job(handler="examples.primes:count").map(chunks):
            print(outcome.result())

An event loop runs in a background thread owned by the client; every call hands a coroutine to
it and waits for the answer. Ctrl-C in a call ends it with KeyboardInterrupt and leaves the job
running and resumable (see :mod:`truba.client.interrupt`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Iterator
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, TypeVar, Unpack, overload

from truba.client.client import Client
from truba.client.dead_letters import DeadLetters
from truba.client.interrupt import DETACH_SECONDS, left_running, run_on
from truba.client.job import Job, P
from truba.client.job_handle import JobHandle
from truba.client.map import MAP_WINDOW
from truba.client.options import ClientOptions, JobOptions
from truba.client.outcome import Outcome, R
from truba.client.running import RunningTasks
from truba.client.schedule import Schedule, ScheduleRun
from truba.proto.v1 import jobs_pb2, schedules_pb2

T = TypeVar("T")


class _LoopThread:
    """An event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="truba-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[object, object, T]) -> T:
        return run_on(self.loop, coro)

    @property
    def running(self) -> bool:
        """The loop still takes calls (not stopped by the client's close)."""
        return not self.loop.is_closed()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


class BlockingJob(Generic[P, R]):
    """A :class:`~truba.client.Job` driven from synchronous code (typed as the Job is)."""

    def __init__(self, job: Job[P, R], runner: _LoopThread) -> None:
        self._job = job
        self._runner = runner

    @property
    def id(self) -> str:
        """The job's id, as the scheduler knows it."""
        return self._job.id

    @property
    def submitted(self) -> int:
        """Tasks submitted so far, by every run on the job's journal (see Job.submitted)."""
        return self._job.submitted

    @property
    def received(self) -> int:
        """Outcomes taken so far (see Job.received)."""
        return self._job.received

    @property
    def done(self) -> bool:
        """Closed, and every submitted task has its outcome."""
        return self._job.done

    def submit(
        self,
        payload: P,
        *,
        priority: int | None = None,
        timeout: float | None = None,
        delay: float | None = None,
        not_before: datetime | None = None,
        key: str | None = None,
    ) -> str:
        """Sends one task (``delay=`` seconds or ``not_before=`` an aware datetime: the brokers
        hold it until then; ``key=``: after the tasks submitted before it with that key, one at a
        time); returns its id (see Job.submit)."""
        return self._run(
            self._job.submit(
                payload, priority=priority, timeout=timeout, delay=delay, not_before=not_before, key=key
            )
        )

    def call(
        self, payload: P, *, priority: int | None = None, timeout: float | None = None, key: str | None = None
    ) -> R:
        """Submits one task and returns its result or raises its error (see Job.call)."""
        return self._run(self._job.call(payload, priority=priority, timeout=timeout, key=key))

    def close(self) -> None:
        """No more tasks."""
        self._run(self._job.close())

    def results(self) -> Iterator[Outcome[R]]:
        """One outcome per task, until the job is done (see Job.results)."""
        return self._iterate(self._job.results())

    def map(
        self,
        payloads: Iterable[P],
        *,
        ordered: bool = True,
        window: int = MAP_WINDOW,
        progress: bool | None = None,
    ) -> Iterator[Outcome[R]]:
        """Submits every payload, closes the job, and yields one outcome per payload, in order
        unless ``ordered=False``; see Job.map. ``payloads`` is read in the client's thread."""
        return self._iterate(self._job.map(payloads, ordered=ordered, window=window, progress=progress))

    def _iterate(self, stream: AsyncGenerator[Outcome[R], None]) -> Iterator[Outcome[R]]:
        interrupted = False
        try:
            while True:
                try:
                    yield self._run(_next(stream))
                except StopAsyncIteration:
                    return
                except (KeyboardInterrupt, SystemExit):
                    interrupted = True  # the stream was cancelled: it is over
                    raise
        finally:  # the caller stopped early: the outcome it did not take comes again
            if not interrupted and self._runner.running:  # (after close: the job was detached)
                self._runner.run(stream.aclose())

    def _run(self, coro: Coroutine[object, object, T]) -> T:
        """Runs a call of the job; Ctrl-C ends it and leaves the job running and resumable."""
        try:
            return self._runner.run(coro)
        except (KeyboardInterrupt, SystemExit):
            if not self._job.ended:
                self._runner.run(self._job.detach(DETACH_SECONDS))
                left_running(self._job.id, resumable=self._job.journal_path is not None)
            raise

    def __enter__(self) -> BlockingJob:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Closes the job after the block (no more tasks); cancels it if the block raised an
        Exception; leaves it running (resumable) on KeyboardInterrupt (see Job.__aexit__)."""
        self._runner.run(self._job.__aexit__(exc_type, exc, tb))

    def detach(self) -> None:
        """Leaves the job to a later ``resume`` (see Job.detach)."""
        self._runner.run(self._job.detach())

    def on_result(self, callback: Callable[[Outcome[R]], None]) -> None:
        """Calls ``callback`` (in the client's loop thread) for every outcome."""

        async def start() -> None:
            self._job.on_result(callback)

        self._runner.run(start())

    def wait(self) -> None:
        """Waits until the on_result consumer delivered every outcome."""
        self._run(self._job.wait())

    def cancel(self) -> None:
        """Cancels the job; tasks without an outcome get a cancelled one (see Job.cancel)."""
        self._runner.run(self._job.cancel())

    def info(self) -> jobs_pb2.Job:
        """The scheduler's current view of the job."""
        return self._runner.run(self._job.info())

    def set_importance(self, importance: float) -> None:
        """Changes the job's weight in the fair share (see Job.set_importance)."""
        self._runner.run(self._job.set_importance(importance))

    def running(self) -> RunningTasks:
        """The job's tasks running now: daemon, slot, attempt, since when (see Job.running)."""
        return self._runner.run(self._job.running())

    def dead_letters(self, *, limit: int = 0, bodies: bool = False) -> DeadLetters:
        """The job's given-up, poison and refused tasks, also after it ends (see Job.dead_letters)."""
        return self._runner.run(self._job.dead_letters(limit=limit, bodies=bodies))

    def retry_dead(self) -> dict[str, str]:
        """Sends the dead tasks again as new tasks of the open job; ``{old id: new id}`` (see
        Job.retry_dead)."""
        return self._runner.run(self._job.retry_dead())


async def _next(stream: AsyncGenerator[T, None]) -> T:
    return await anext(stream)


class BlockingJobHandle:
    """A job by id (see :meth:`truba.Client.job`), driven from synchronous code."""

    def __init__(self, handle: JobHandle, runner: _LoopThread) -> None:
        self._handle = handle
        self._runner = runner

    @property
    def id(self) -> str:
        """The job's id."""
        return self._handle.id

    def info(self) -> jobs_pb2.Job:
        """The scheduler's current view of the job."""
        return self._runner.run(self._handle.info())

    def watch(self) -> Iterator[jobs_pb2.JobEvent]:
        """The job now, then on every change until it ends."""
        stream = self._handle.watch()
        try:
            while True:
                try:
                    yield self._runner.run(_next(stream))
                except StopAsyncIteration:
                    return
        finally:
            if self._runner.running:
                with contextlib.suppress(RuntimeError):  # still running after an interrupt
                    self._runner.run(stream.aclose())

    def running(self) -> RunningTasks:
        """The job's tasks running now: daemon, slot, attempt, since when (see Job.running)."""
        return self._runner.run(self._handle.running())

    def set_importance(self, importance: float) -> jobs_pb2.Job:
        """Changes the job's weight in the fair share."""
        return self._runner.run(self._handle.set_importance(importance))

    def cancel(self) -> jobs_pb2.Job:
        """Cancels the job (see JobHandle.cancel)."""
        return self._runner.run(self._handle.cancel())


class BlockingSchedule:
    """A :class:`~truba.client.schedule.Schedule` driven from synchronous code."""

    def __init__(self, schedule: Schedule, runner: _LoopThread) -> None:
        self._schedule = schedule
        self._runner = runner

    @property
    def id(self) -> str:
        return self._schedule.id

    @property
    def info(self) -> schedules_pb2.Schedule:
        """The scheduler's view as of the last call."""
        return self._schedule.info

    def refresh(self) -> schedules_pb2.Schedule:
        return self._runner.run(self._schedule.refresh())

    def runs(self, limit: int = 0) -> list[ScheduleRun]:
        """The last runs, newest first (see Schedule.runs)."""
        return self._runner.run(self._schedule.runs(limit))

    def pause(self) -> None:
        self._runner.run(self._schedule.pause())

    def resume(self) -> None:
        self._runner.run(self._schedule.resume())

    def delete(self) -> None:
        self._runner.run(self._schedule.delete())


class BlockingClient:
    """A :class:`~truba.client.Client` driven from synchronous code; see :func:`connect`."""

    def __init__(self, address: str, **options: Unpack[ClientOptions]) -> None:
        self._runner = _LoopThread()
        self._client = Client(address, **options)
        self._runner.run(self._client.connect())

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @overload
    def create_job(
        self,
        handler: Callable[[P], R],
        importance: float = 1.0,
        *,
        name: str = "",
        **options: Unpack[JobOptions],
    ) -> BlockingJob[P, R]: ...

    @overload
    def create_job(
        self, handler: str, importance: float = 1.0, *, name: str = "", **options: Unpack[JobOptions]
    ) -> BlockingJob: ...

    def create_job(
        self,
        handler: str | Callable[[Any], Any],
        importance: float = 1.0,
        *,
        name: str = "",
        **options: Unpack[JobOptions],
    ) -> BlockingJob[Any, Any]:
        """Creates a job; the arguments are :meth:`truba.Client.create_job`'s."""
        job = self._runner.run(self._client.create_job(handler, importance, name=name, **options))
        return BlockingJob(job, self._runner)

    def resume(self, job_id: str) -> BlockingJob:
        """Picks up a job from this client's journal (see Client.resume)."""
        return BlockingJob(self._runner.run(self._client.resume(job_id)), self._runner)

    def job(self, job_id: str) -> BlockingJobHandle:
        """A job by id, from any process (see Client.job)."""
        return BlockingJobHandle(self._client.job(job_id), self._runner)

    def get_job_info(self, job_id: str) -> jobs_pb2.Job:
        """The scheduler's view of a job (see Client.get_job_info)."""
        return self._runner.run(self._client.get_job_info(job_id))

    def list_jobs(self, include_done: bool = False) -> list[jobs_pb2.Job]:
        """The scheduler's jobs, ended ones too with ``include_done``."""
        return self._runner.run(self._client.list_jobs(include_done))

    def cluster_info(self) -> jobs_pb2.ClusterInfo:
        """Brokers, connected daemons and their slots."""
        return self._runner.run(self._client.cluster_info())

    def create_schedule(
        self,
        handler: str | Callable[[Any], Any],
        *,
        every: float | None = None,
        cron: str | None = None,
        payload: object = None,
        deadline: float | None = None,
        importance: float = 1.0,
        name: str = "",
    ) -> BlockingSchedule:
        """A periodic schedule; the arguments are :meth:`truba.Client.create_schedule`'s."""
        schedule = self._client.create_schedule(
            handler,
            every=every,
            cron=cron,
            payload=payload,
            deadline=deadline,
            importance=importance,
            name=name,
        )
        return BlockingSchedule(self._runner.run(schedule), self._runner)

    def schedules(self) -> list[BlockingSchedule]:
        """Every schedule, oldest first."""
        return [BlockingSchedule(s, self._runner) for s in self._runner.run(self._client.schedules())]

    def schedule(self, schedule_id: str) -> BlockingSchedule:
        """A schedule by id (NotFound for an unknown one)."""
        return BlockingSchedule(self._runner.run(self._client.schedule(schedule_id)), self._runner)

    def close(self) -> None:
        """Detaches unfinished jobs (see Client.close), closes connections, stops the loop."""
        self._runner.run(self._client.close())
        self._runner.stop()


def connect(address: str = "127.0.0.1:50051", **options: Unpack[ClientOptions]) -> BlockingClient:
    """A blocking client for the scheduler at ``address``; use it as a context manager.
    ``options`` are :class:`~truba.client.Client`'s."""
    return BlockingClient(address, **options)
