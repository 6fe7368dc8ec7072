"""The log layer: failed confirmations are logged unless the owner logs them (``confirms=False``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from truba.pipes.base import Layer, Sender
from truba.pipes.log import LogSender, log_errors
from truba.pipes.testing import FakeSender


async def _nacked(sender: Sender[bytes], fake: FakeSender[bytes]) -> None:
    confirmation = await sender.send(b"m")
    fake.reject()
    await asyncio.wait((confirmation,))
    await asyncio.sleep(0)  # the done-callbacks run on the next turn of the loop


@pytest.mark.parametrize(("confirms", "logged"), [(True, 1), (False, 0)])
async def test_a_nacked_message_is_logged_by_the_layer_only_when_it_watches_confirms(
    caplog: pytest.LogCaptureFixture, confirms: bool, logged: int
) -> None:
    caplog.set_level(logging.WARNING, logger="truba.pipes.log")
    fake: FakeSender[bytes] = FakeSender()
    layer: Layer[bytes, bytes] = log_errors("tasks", confirms=confirms)
    sender = layer(fake)
    assert isinstance(sender, LogSender)
    await _nacked(sender, fake)
    unconfirmed = [r for r in caplog.records if r.getMessage() == "pipe.tasks.unconfirmed"]
    assert len(unconfirmed) == logged


async def test_without_confirms_the_layer_still_logs_a_failed_send(caplog: pytest.LogCaptureFixture) -> None:
    from truba.pipes.errors import PipeBroken

    caplog.set_level(logging.WARNING, logger="truba.pipes.log")
    fake: FakeSender[bytes] = FakeSender()
    fake.fail_next(PipeBroken("gone"))
    layer: Layer[bytes, bytes] = log_errors("tasks", confirms=False)
    sender = layer(fake)
    with pytest.raises(PipeBroken):
        await sender.send(b"m")
    assert [r.getMessage() for r in caplog.records] == ["pipe.tasks.failed"]
