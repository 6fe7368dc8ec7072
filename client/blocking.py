"""The blocking facade: the same verbs as :class:`~truba.client.Client`, for code without asyncio.

::

    with truba.connect("localhost:50051") as client:
        outcomes = client.create_job(handler="examples.primes:count").map(chunks)

An event loop runs in a background thread owned by the client; every call hands a coroutine to
it and waits for the answer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from types import TracebackType
from typing import TypeVar, Unpack

from truba.client.client import Client
from truba.client.job import Job
from truba.client.options import JobOptions
from truba.client.outcome import Outcome
from truba.proto.v1 import jobs_pb2

R = TypeVar("R")


class _LoopThread:
    """An event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="truba-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[object, object, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


class BlockingJob:
    """A :class:`~truba.client.Job` driven from synchronous code."""

    def __init__(self, job: Job, runner: _LoopThread) -> None:
        self._job = job
        self._runner = runner

    @property
    def id(self) -> str:
        return self._job.id

    def submit(self, payload: object, *, priority: int | None = None) -> str:
        """Sends one task; returns its id (see Job.submit)."""
        return self._runner.run(self._job.submit(payload, priority=priority))

    def close(self) -> None:
        """No more tasks."""
        self._runner.run(self._job.close())

    def results(self) -> Iterator[Outcome]:
        """One outcome per task, until the job is done (see Job.results)."""
        stream: AsyncIterator[Outcome] = self._job.results()
        while True:
            try:
                yield self._runner.run(_next(stream))
            except StopAsyncIteration:
                return

    def map(self, payloads: Iterable[object]) -> list[Outcome]:
        """Submits every payload, closes the job and returns the outcomes in submission order."""
        return self._runner.run(self._job.map(payloads))

    def on_result(self, callback: Callable[[Outcome], None]) -> None:
        """Calls ``callback`` (in the client's loop thread) for every outcome."""

        async def start() -> None:
            self._job.on_result(callback)

        self._runner.run(start())

    def wait(self) -> None:
        """Waits until the on_result consumer delivered every outcome."""
        self._runner.run(self._job.wait())

    def cancel(self) -> None:
        self._runner.run(self._job.cancel())

    def info(self) -> jobs_pb2.Job:
        return self._runner.run(self._job.info())

    def set_importance(self, importance: float) -> None:
        """Changes the job's weight in the fair share (see Job.set_importance)."""
        self._runner.run(self._job.set_importance(importance))


async def _next(stream: AsyncIterator[Outcome]) -> Outcome:
    return await anext(stream)


class BlockingClient:
    """A :class:`~truba.client.Client` driven from synchronous code; see :func:`connect`."""

    def __init__(self, address: str, **options: float) -> None:
        self._runner = _LoopThread()
        self._client = Client(address, **options)  # type: ignore[arg-type]
        self._runner.run(self._client.connect())

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def create_job(
        self, handler: str, importance: float = 1.0, *, name: str = "", **options: Unpack[JobOptions]
    ) -> BlockingJob:
        """Creates a job; the arguments are :meth:`truba.Client.create_job`'s."""
        job = self._runner.run(self._client.create_job(handler, importance, name=name, **options))
        return BlockingJob(job, self._runner)

    def get_job_info(self, job_id: str) -> jobs_pb2.Job:
        return self._runner.run(self._client.get_job_info(job_id))

    def list_jobs(self, include_done: bool = False) -> list[jobs_pb2.Job]:
        return self._runner.run(self._client.list_jobs(include_done))

    def cluster_info(self) -> jobs_pb2.ClusterInfo:
        return self._runner.run(self._client.cluster_info())

    def close(self) -> None:
        self._runner.run(self._client.close())
        self._runner.stop()


def connect(address: str = "127.0.0.1:50051") -> BlockingClient:
    """A blocking client for the scheduler at ``address``; use it as a context manager."""
    return BlockingClient(address)
