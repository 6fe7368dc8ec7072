"""``truba up`` keeps its processes alive: a dead one is reaped, reported and restarted with backoff.

:meth:`Supervisor.check` is called from ``truba up``'s main loop (a few times a second). Each
truba process (scheduler, daemons) and local node that died is reaped at once (no zombie), one
line says so, and it is started again after a delay that doubles on every death in quick
succession (1 s, 2 s, 4 s … at most :data:`MAX_DELAY`) and starts over once the process has run
for :data:`STABLE_AFTER` seconds. A node restarts with its name, ports and data. A process that
exits with status 0 was told to (``truba drain``, a SIGTERM from its owner): it is reported and
left stopped.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, final

from truba.local.cluster import LocalCluster, TrubaProcess
from truba.local.node import LocalRabbitNode, NodeError

FIRST_DELAY: Final = 1.0
MAX_DELAY: Final = 30.0
STABLE_AFTER: Final = 60.0
"""Seconds a restarted process must run before its next death counts as a first one again."""


def exit_reason(code: int) -> str:
    """``popen.returncode`` in words: ``exited with 3``, ``killed by SIGKILL``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with {code}"


@dataclass
class _Backoff:
    deaths: int = 0
    due: float | None = None


@final
@dataclass
class Supervisor:
    """Restarts the dead processes and nodes of ``cluster``; ``say`` prints one line per event."""

    cluster: LocalCluster
    say: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    on_restart: Callable[[], None] = lambda: None
    """Called after each restart or removal (``truba up`` saves the pids)."""
    _backoff: dict[str, _Backoff] = field(default_factory=dict)
    _node_started: dict[str, float] = field(default_factory=dict)

    def check(self) -> None:
        """Reaps and reports what died; restarts what is due."""
        now = self.clock()
        for node in self.cluster.nodes:
            self._check_node(node, now)
        for process in list(self.cluster.processes):
            self._check_process(process, now)

    def _delay(self, name: str, started_at: float, now: float) -> _Backoff:
        backoff = self._backoff.setdefault(name, _Backoff())
        if now - started_at >= STABLE_AFTER:
            backoff.deaths = 0
        delay = min(MAX_DELAY, FIRST_DELAY * 2**backoff.deaths)
        backoff.deaths += 1
        backoff.due = now + delay
        return backoff

    def _check_process(self, process: TrubaProcess, now: float) -> None:
        code = process.popen.poll()  # reaps a dead child
        if code is None:
            return
        if code == 0:  # it was told to go (a drained daemon): a restart would undo that
            self.cluster.processes.remove(process)
            self.say(
                f"{process.name} (pid {process.pid}) exited with 0 (drained or stopped); not restarting it"
            )
            self.on_restart()
            return
        backoff = self._backoff.get(process.name)
        if backoff is None or backoff.due is None:
            backoff = self._delay(process.name, process.started_at, now)
            assert backoff.due is not None
            self.say(
                f"{process.name} (pid {process.pid}) {exit_reason(code)}; restarting it in "
                f"{backoff.due - now:g} s (log: {process.log_path})"
            )
            return
        if now < backoff.due:
            return
        backoff.due = None
        try:
            self.cluster.respawn(process)
        except RuntimeError as exc:
            self.say(f"{process.name} did not come back: {exc}")
        self.on_restart()

    def _check_node(self, node: LocalRabbitNode, now: float) -> None:
        if node.running:
            return
        name = node.nodename
        backoff = self._backoff.get(name)
        if backoff is None or backoff.due is None:
            backoff = self._delay(name, self._node_started.get(name, 0.0), now)
            assert backoff.due is not None
            self.say(f"broker {name} (port {node.port}) stopped; restarting it in {backoff.due - now:g} s")
            return
        if now < backoff.due:
            return
        backoff.due = None
        try:
            node.restart()  # reaps the dead VM, starts it on the same ports with its data
        except NodeError as exc:
            self.say(f"broker {name} did not come back: {str(exc).splitlines()[0]}")
            return
        self._node_started[name] = self.clock()
        self.say(f"broker {name} is back on port {node.port}")
        self.on_restart()
