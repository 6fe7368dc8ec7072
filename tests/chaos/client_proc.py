"""The chaos run's client: runs the planned jobs, and resumes them from its journal after a kill -9.

Usage: ``client_proc.py ADDRESS WORKDIR``. Reads ``WORKDIR/jobs.json`` (the plan) and
``WORKDIR/t0`` (the run's start, wall clock), keeps ``WORKDIR/client/state.json`` (tag → job id,
and the tags whose outcomes were all taken) and the journal in ``WORKDIR/client/journal``.
Each incarnation writes the outcomes it takes to ``WORKDIR/client/outcomes.<pid>``, a line per
outcome, flushed before the next one is asked for (the moment the journal forgets the previous
one). Exits 0 once every job's outcomes are all taken.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tests.chaos.plan import JobSpec
from truba.client import Client
from truba.client.errors import NotFound
from truba.errors import TrubaError

HANDLER = "tests.handlers.chaos:work"
log = logging.getLogger("chaos.client")


class State:
    """Tag → job id and the finished tags, written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        data = json.loads(path.read_text()) if path.exists() else {}
        self.jobs: dict[str, str] = dict(data.get("jobs", {}))
        self.done: set[str] = set(data.get("done", []))

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"jobs": self.jobs, "done": sorted(self.done)}))
        os.replace(tmp, self.path)


async def retrying(what: str, call: Any, seconds: float = 120.0) -> Any:
    """``await call()``, again every 0.5 s while the scheduler or a broker is away."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except NotFound:
            raise
        except TrubaError as exc:
            if time.monotonic() > deadline:
                raise
            log.info("chaos.client.retry", extra={"what": what, "error": repr(exc)})
            await asyncio.sleep(0.5)


async def run_job(client: Client, spec: JobSpec, folder: str, t0: float, state: State, out: TextIO) -> None:
    await asyncio.sleep(max(0.0, t0 + spec.start - time.time()))
    job: Any
    if spec.tag in state.jobs:
        try:
            job = await retrying("resume", lambda: client.resume(state.jobs[spec.tag]))
        except NotFound:  # finished (every outcome taken) before the kill
            state.done.add(spec.tag)
            state.save()
            return
    else:
        options: dict[str, Any] = {
            "frames": spec.frames,
            "queue_type": spec.queue_type,
            "preemption": spec.preemption,
            "max_attempts": 100,
        }
        job = await retrying(
            "create", lambda: client.create_job(HANDLER, spec.importance, name=spec.tag, **options)
        )
        state.jobs[spec.tag] = job.id
        state.save()
    print(f"job {spec.tag} {job.id}", flush=True)

    async def submit_all() -> None:
        low, high = spec.sleep_ms
        for i in range(job.submitted, spec.tasks):
            await asyncio.sleep(max(0.0, t0 + spec.start + i / spec.rate - time.time()))
            seconds = (low + (i * 7919) % (high - low + 1)) / 1000
            await job.submit([folder, spec.tag, i, seconds])
        await retrying("close", job.close)

    submitting = asyncio.create_task(submit_all())
    async for outcome in job.results():
        value = outcome.value if outcome.ok else None
        error = None if outcome.ok else (outcome.error.type if outcome.error else "gave_up")
        record = {
            "tag": spec.tag,
            "task_id": outcome.task_id,
            "ok": outcome.ok,
            "value": value,
            "error": error,
            "attempts": outcome.attempts,
            "t": time.time(),
        }
        out.write(json.dumps(record) + "\n")
        out.flush()
    await submitting
    state.done.add(spec.tag)
    state.save()
    print(f"done {spec.tag}", flush=True)


async def main(address: str, workdir: Path) -> None:
    specs = [JobSpec.from_json(j) for j in json.loads((workdir / "jobs.json").read_text())]
    t0 = float((workdir / "t0").read_text())
    home = workdir / "client"
    home.mkdir(exist_ok=True)
    state = State(home / "state.json")
    folder = str(workdir / "executions")
    with open(home / f"outcomes.{os.getpid()}", "a") as out:
        async with Client(address, journal=home / "journal") as client:
            todo = [s for s in specs if s.tag not in state.done]
            await asyncio.gather(*(run_job(client, s, folder, t0, state, out) for s in todo))
    print("all done", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
