"""let_out: a message sent to a leaf like RabbitMQ's is written when it returns."""

from __future__ import annotations

from tests.unit.pipes.two_turn_leaf import TwoTurnLeaf
from truba.pipes.outbound import let_out


async def test_a_message_sent_is_written_once_let_out_returns() -> None:
    leaf: TwoTurnLeaf[str] = TwoTurnLeaf()
    await leaf.send("m1")
    assert leaf.written == []  # the publish and the writer have not run yet
    await let_out()
    assert leaf.written == ["m1"]
    await leaf.close()
