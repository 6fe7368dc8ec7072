"""RouteSender: one stack per key, each message through its own."""

from __future__ import annotations

import pytest

from truba.pipes.errors import PipeClosed
from truba.pipes.pipeline import describe
from truba.pipes.route import RouteSender
from truba.pipes.testing import FakeSender


async def test_messages_go_through_the_sender_their_key_names_made_on_first_use() -> None:
    made: dict[int, FakeSender[str]] = {}

    def make(key: int) -> FakeSender[str]:
        made[key] = FakeSender()
        return made[key]

    router: RouteSender[str, int] = RouteSender(len, make)
    for word in ("a", "bb", "cc", "d"):
        await router.send(word)
    assert sorted(made) == [1, 2]
    assert made[1].sent == ["a", "d"] and made[2].sent == ["bb", "cc"]
    assert sorted(router.unconfirmed()) == ["a", "bb", "cc", "d"]
    made[1].confirm()
    assert sorted(router.unconfirmed()) == ["bb", "cc"]
    router.drop_unconfirmed()
    assert router.unconfirmed() == []
    assert describe(router).startswith("route[")
    await router.close()
    assert made[1].closed and made[2].closed
    with pytest.raises(PipeClosed):
        await router.send("e")
