"""The fork server's template: ``python -m truba.daemon.template FD [handler ...]``.

One long-lived process per daemon (per handler set) that imports the slot code and the handlers'
modules once, then forks slots on request, so every slot starts warm and shares those pages with
the template (copy-on-write) instead of importing its own copy.

Protocol over the ``SOCK_SEQPACKET`` unix socket ``FD`` (one message per packet, see
:data:`MESSAGE`): the template sends ``R`` (ready; ``pid`` = its own, ``value`` = handlers that
imported) once the preload is done. Each request is ``F`` with two file descriptors attached,
the slot's stdin (read end) and stdout (write end); the template forks a child that runs
:func:`truba.daemon.slot_main.main` on them and answers ``P`` with its pid. When a child exits the
template reaps it and sends ``X`` with its exit code (``-N`` for signal N, as ``subprocess``).

Death: the template dies with the daemon (``PR_SET_PDEATHSIG``) and its slots die with the
template (each asks the same of its own parent), so nothing outlives the daemon, even after a
kill -9. The flip side: a template killed on its own takes its slots with it; the daemon sees
them die as it would see any slot die, and starts a new template. The template exits when the
daemon closes the socket.

Preloading is best-effort: a handler whose module fails to import (or exits at import) is
skipped with a line on stderr; its tasks then report the import error from the slot, as ever.
What a module does at import is shared by every slot forked after it, as with any preloading
server (gunicorn ``--preload``): a socket it opens is one socket for all slots, and a thread it
starts exists only in the template (forking a process that has threads can deadlock the child
on a lock one of them held). Such modules should connect lazily; ``--no-fork-server`` spawns.
"""

from __future__ import annotations

import gc
import importlib
import os
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Final

from truba.daemon import slot_main as slot

MESSAGE: Final = struct.Struct(">cii")
"""kind, pid, value: ``R`` ready (value: handlers preloaded), ``P`` forked, ``X`` exited (value:
exit code), ``F`` fork request (pid and value unused, two fds attached)."""


def preload(handlers: list[str]) -> int:
    """Imports each handler's module; returns how many imported. Never raises."""
    loaded = 0
    for handler in handlers:
        module_name = handler.partition(":")[0]
        try:
            importlib.import_module(module_name)
            loaded += 1
        except BaseException as exc:  # best effort: even SystemExit at import must not stop us
            print(
                f"truba template: cannot preload {handler!r}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
    return loaded


def _child(template: int, own: list[socket.socket], fds: list[int]) -> None:
    """In the forked child: become a slot on ``fds`` (stdin, stdout); never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in own:  # the template's sockets are not the slot's business
            sock.close()
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        code = slot.main(parent=template)
    except SystemExit as exc:  # what the interpreter would do with it at exit
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(MESSAGE.pack(b"X", pid, os.waitstatus_to_exitcode(status)))


def serve(control: socket.socket) -> int:
    """Forks slots on request until the daemon closes ``control``."""
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select via the wakeup fd
    signal.set_wakeup_fd(wake_w.fileno())
    while True:
        try:
            readable, _, _ = select.select([control, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            while True:
                try:
                    if not wake_r.recv(4096):
                        break
                except BlockingIOError:
                    break
            _reap(control)
        if control in readable:
            data, fds, _, _ = socket.recv_fds(control, MESSAGE.size, 2)
            if not data:
                return 0
            if data[:1] != b"F" or len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                print(f"truba template: bad request {data!r}", file=sys.stderr, flush=True)
                continue
            template = os.getpid()
            pid = os.fork()
            if pid == 0:
                _child(template, [control, wake_r, wake_w], fds)
            for fd in fds:
                os.close(fd)
            control.send(MESSAGE.pack(b"P", pid, 0))


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    slot.die_with_parent()
    control = socket.socket(fileno=int(sys.argv[1]))
    loaded = preload(sys.argv[2:])
    # Objects that exist now are never collected in a slot: the collector then leaves their
    # pages alone, so they stay shared with the template (gc.freeze's documented use).
    gc.freeze()
    control.send(MESSAGE.pack(b"R", os.getpid(), loaded))
    return serve(control)


if __name__ == "__main__":
    sys.exit(main())
