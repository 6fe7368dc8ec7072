"""The exit statuses of ``truba`` commands (sysexits-like), and the error that carries one.

==== ============ ===============================================================
code name         when
==== ============ ===============================================================
0    OK           done (``status``: the scheduler is SERVING)
1    FAILURE      anything else: the scheduler refused (no such job or daemon, a job
                  that already ended), ``status`` not SERVING, a cluster already up
2    USAGE        a bad command line, or an argument the scheduler calls invalid
69   UNAVAILABLE  the scheduler cannot be reached, or did not answer in time
77   NOPERM       the scheduler refused the token (missing or wrong ``$TRUBA_TOKEN``)
130  INTERRUPTED  Ctrl-C
==== ============ ===============================================================
"""

from __future__ import annotations

from typing import Final

import grpc

from truba.errors import TrubaError

OK: Final = 0
FAILURE: Final = 1
USAGE: Final = 2
UNAVAILABLE: Final = 69
NOPERM: Final = 77
INTERRUPTED: Final = 130

_BY_CODE: Final = {
    grpc.StatusCode.UNAVAILABLE: UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: UNAVAILABLE,
    grpc.StatusCode.INVALID_ARGUMENT: USAGE,
    grpc.StatusCode.UNAUTHENTICATED: NOPERM,
    grpc.StatusCode.PERMISSION_DENIED: NOPERM,
}


class CliError(TrubaError):
    """A command failed; ``str()`` is the one line to print, ``exit_code`` the status to exit with."""

    def __init__(self, message: str, exit_code: int = FAILURE) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the cause said
        self.exit_code = exit_code


def rpc_failed(error: grpc.RpcError, address: str, timeout: float) -> CliError:
    """The :class:`CliError` for a failed call to the scheduler at ``address``."""
    code = error.code()
    details = error.details() or ""
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        message = f"scheduler {address}: no answer within {timeout:g} s"
    elif code is grpc.StatusCode.UNAVAILABLE:
        message = f"scheduler {address}: unreachable ({details})"
    else:
        message = f"{code.name}: {details}"
    return CliError(message, _BY_CODE.get(code, FAILURE))
