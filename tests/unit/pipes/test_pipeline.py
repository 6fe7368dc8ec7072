"""The builder: order of layers, printable stacks, and a smoke test of a full stack over fakes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from truba.backoff import Backoff
from truba.pipes.balance import BalanceSender
from truba.pipes.log import log_errors
from truba.pipes.merge import MergeListener
from truba.pipes.pipeline import ListenerPipeline, Pipeline, describe, pipeline
from truba.pipes.reopen import ReopenSender
from truba.pipes.retry import retry
from truba.pipes.serialize import deserialize, serialize
from truba.pipes.spool import spool
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import TaskCodec, TaskMessage


async def test_layers_compose_outermost_first_and_the_stack_prints_as_names(tmp_path: Path) -> None:
    bottoms = [FakeSender[bytes](auto_confirm=True) for _ in range(2)]

    async def connect_0() -> FakeSender[bytes]:
        return bottoms[0]

    async def connect_1() -> FakeSender[bytes]:
        return bottoms[1]

    start: Pipeline[TaskMessage, TaskMessage] = pipeline(TaskMessage)
    sender = (
        start.layer(serialize(TaskCodec()))
        .layer(spool(tmp_path / "outbox", fsync="never"))
        .layer(retry(Backoff(attempts=3)))
        .layer(log_errors("tasks"))
        .build(BalanceSender([ReopenSender(connect_0), ReopenSender(connect_1)]))
    )
    for i in range(20):
        await asyncio.wait_for(await sender.send(TaskMessage(f"t{i}", i)), 1.0)
    # serialize saw each message first: the bottoms hold encoded tasks, spread over both.
    sent = [TaskCodec().decode(m) for b in bottoms for m in b.sent]
    assert sorted(m.task_id for m in sent) == sorted(f"t{i}" for i in range(20))
    assert all(b.sent for b in bottoms)
    assert describe(sender) == "serialize → spool → retry → log → balance[reopen → fake, reopen → fake]"
    await sender.close()
    assert all(b.closed for b in bottoms)


async def test_listener_stacks_print_too() -> None:
    leaves = [FakeListener[bytes](), FakeListener[bytes]()]
    start: ListenerPipeline[TaskMessage, TaskMessage] = ListenerPipeline(lambda listener: listener)
    listener = start.layer(deserialize(TaskCodec())).build(MergeListener(leaves))
    leaves[1].push(TaskCodec().encode(TaskMessage("t", "payload")))
    delivery = await listener.get(1.0)
    assert delivery is not None and delivery.message == TaskMessage("t", "payload")
    assert describe(listener) == "deserialize → merge[fake, fake]"
    await listener.close()
