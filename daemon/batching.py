"""Batch handlers on the daemon side: collecting a batch (it runs under watch like a single task,
through :func:`truba.daemon.supervise.supervised`).

A batch handler (see :mod:`truba.handlers`) takes up to ``max_size`` tasks per call. A worker
that got its first delivery keeps taking more, without waiting past ``max_wait`` after the first,
then runs them as one call on its slot; every task still ends on its own (result, requeue or
give-up through :mod:`truba.daemon.task_endings`).

The whole batch is one attempt for each of its tasks: a timeout, the memory limit or a crash
spends an attempt of every task in it; an interrupt (preemption) puts all back unspent; a reply
gives each task its own outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from truba.handlers import BatchSpec
from truba.pipes.base import Delivery, Listener
from truba.wire import TaskMessage


async def collect(
    tasks: Listener[TaskMessage],
    first: Delivery[TaskMessage],
    spec: BatchSpec,
    stop: Callable[[], bool] = lambda: False,
) -> list[Delivery[TaskMessage]]:
    """``first`` and whatever else arrives, up to ``spec.max_size`` and for at most
    ``spec.max_wait`` seconds after the call; earlier once ``stop()`` is true."""
    batch = [first]
    deadline = time.monotonic() + spec.max_wait
    while len(batch) < spec.max_size and not stop():
        delivery = await tasks.get(max(0.0, deadline - time.monotonic()))
        if delivery is None:
            break
        batch.append(delivery)
    return batch
