"""The codec of a job's result pipe on the client: each result decoded straight into its
:class:`~truba.client.outcome.Outcome`.

Every task's result passes here once; building the outcome from the wire's fields (no
:class:`~truba.wire.ResultMessage` first, then a copy) keeps one object per result off the
client's hot path. The wire format, its checks and its errors are
:class:`~truba.wire.ResultCodec`'s.
"""

from __future__ import annotations

from typing import final

from truba.client.outcome import Outcome
from truba.wire import ResultCodec, ResultMessage


@final
class OutcomeCodec:
    """``Outcome`` <-> a result's bytes; ``unpickle`` as :class:`~truba.wire.ResultCodec`'s."""

    def __init__(self, *, unpickle: bool = False) -> None:
        self._results = ResultCodec(unpickle=unpickle)

    def decode(self, data: bytes) -> Outcome:
        """Raises :class:`~truba.pipes.errors.CodecError` as the result codec does."""
        return self._results.decode_as(data, Outcome)

    def encode(self, message: Outcome) -> bytes:
        """The result this outcome came from (tests and tools; the client never sends results)."""
        return self._results.encode(
            ResultMessage(
                message.task_id,
                message.ok,
                message.value,
                message.error,
                message.daemon_id,
                message.seconds,
                message.attempts,
                message.gave_up,
            )
        )
