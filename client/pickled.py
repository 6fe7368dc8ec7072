"""Payloads of a job created with ``codec="pickle"``: pickled on the client before they are sent.

Only daemons started with ``--allow-pickle`` run such a job (unpickling runs code of the
payload's choosing); others give each task a ``PickleRefused`` error. Results come back pickled
and are unpickled by the job's result codec (:class:`truba.wire.ResultCodec`).
"""

from __future__ import annotations

import msgpack

from truba import codec
from truba.pipes.errors import CodecError


def pickled_payload(payload: object) -> msgpack.ExtType:
    """``payload`` pickled, as the task carries it.

    Raises:
        CodecError: it cannot be pickled (nothing is sent).
    """
    try:
        return codec.pickled(payload)
    except Exception as exc:  # pickle raises PicklingError, TypeError, AttributeError, ...
        raise CodecError(f"payload cannot be pickled: {type(exc).__name__}: {exc}") from exc
