"""One independent RabbitMQ node on a free loopback port, and the process faults tests inject into it.

The node runs the versioned ``rabbitmq-server`` script with ``RABBITMQ_ALLOW_INPUT`` set, so the script
``exec``s ``erl`` → ``erlexec`` → ``beam.smp`` and the process this object starts *is* the broker VM:
``kill -9`` hits ``beam.smp`` and no wrapper shell is left behind. The VM then reads its stdin, which is
a pipe held by this object; when the owning process exits (even by ``kill -9``) the pipe closes and the
VM halts, so a crashed test session or ``truba up`` leaves no broker running. Pass
``die_with_owner=False`` to detach the node's lifetime from its owner.

Thread-safe: every lifecycle method takes a lock, so tests may drive a node from ``asyncio.to_thread``.
:func:`~truba.local.nodes.start_nodes` boots several independent nodes (never clustered) from
threads: a boot is mostly one VM loading code, so parallel boots overlap.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Final, final

from truba.local.epmd import epmd_names, unique_nodename
from truba.local.layout import NodeLayout, sbin_dir
from truba.local.ports import free_port
from truba.local.probe import listens_on, speaks_amqp

log = logging.getLogger(__name__)

_POLL_S: Final = 0.1
_PORT_ATTEMPTS: Final = 3
_EPMD_RELEASE_S: Final = 5.0
_KILL_WAIT_S: Final = 10.0
_BOOTED: Final = b"completed with"
"""What RabbitMQ prints to stdout once its boot has finished ("Starting broker... completed with 0
plugins."). Its AMQP listener opens before the boot's last steps; a node killed in between once
came back without the durable queue declared on it just before (CI, twice), so a node counts as
started only once it has printed this."""


class NodeError(RuntimeError):
    """A local RabbitMQ node operation failed."""


class NodeStartError(NodeError):
    """The node did not accept AMQP connections in time; the message ends with the tail of its logs."""


class CtlError(NodeError):
    """``rabbitmqctl`` exited non-zero or timed out; the message holds its output."""


@final
class LocalRabbitNode:
    """A RabbitMQ node process owned by this object, with its data in ``base_dir``.

    ``name`` defaults to a fresh :func:`unique_nodename`; ``port`` (AMQP) and ``dist_port`` (Erlang
    distribution) default to free loopback ports. All three stay fixed across :meth:`restart`, so data
    and client URLs survive a kill. ``config`` adds or overrides ``rabbitmq.conf`` settings.
    """

    MEMORY_LIMIT: Final = "1GB"

    def __init__(
        self,
        base_dir: Path,
        name: str | None = None,
        port: int | None = None,
        *,
        dist_port: int | None = None,
        config: Mapping[str, str] | None = None,
        die_with_owner: bool = True,
    ) -> None:
        self._layout = NodeLayout(Path(base_dir).absolute())
        nodename = name or unique_nodename()
        self._nodename = nodename if "@" in nodename else f"{nodename}@localhost"
        self._ports_fixed = port is not None
        self._port = port if port is not None else free_port()
        self._dist_port = dist_port if dist_port is not None else free_port(exclude=frozenset({self._port}))
        self._config = {"vm_memory_high_watermark.absolute": self.MEMORY_LIMIT, **(config or {})}
        self._die_with_owner = die_with_owner
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdout: IO[bytes] | None = None
        self._paused = False
        self._lock = threading.RLock()

    # -- identity ---------------------------------------------------------------------------------

    @property
    def nodename(self) -> str:
        """The Erlang node name, ``name@localhost``."""
        return self._nodename

    @property
    def port(self) -> int:
        """The AMQP port on 127.0.0.1."""
        return self._port

    @property
    def dist_port(self) -> int:
        """The Erlang distribution port on 127.0.0.1."""
        return self._dist_port

    @property
    def host(self) -> str:
        """The address the AMQP listener is bound to."""
        return "127.0.0.1"

    @property
    def url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:<port>/`` (guest may log in: ``loopback_users = none``)."""
        return f"amqp://guest:guest@127.0.0.1:{self._port}/"

    @property
    def base_dir(self) -> Path:
        """The directory holding the node's data, logs, config and cookie."""
        return self._layout.base

    @property
    def running(self) -> bool:
        """True while the ``beam.smp`` process this object started is alive (paused counts)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._paused

    @property
    def pid(self) -> int:
        """The OS pid of the node's ``beam.smp``.

        Raises:
            NodeError: the node is not running.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise NodeError(f"node {self._nodename} is not running")
        return proc.pid

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the node's stdout and log file."""
        return self._layout.log_tail(self._nodename, lines)

    def __repr__(self) -> str:
        state = "paused" if self._paused else "running" if self.running else "stopped"
        return f"LocalRabbitNode({self._nodename!r}, port={self._port}, {state})"

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Starts the node and returns once it answers AMQP on :attr:`port` and has finished booting.

        Raises:
            NodeError: already running.
            NodeStartError: the process exited or did not answer within ``timeout`` seconds; it is killed.
        """
        with self._lock:
            if self.running:
                raise NodeError(f"node {self._nodename} is already running")
            deadline = time.monotonic() + timeout
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                try:
                    self._start_once(deadline)
                except NodeStartError as exc:
                    # Ports are probed, not reserved: another process may bind one first. Only ports we
                    # picked ourselves, before the first successful start, may move.
                    if self._ports_fixed or attempt == _PORT_ATTEMPTS or "eaddrinuse" not in str(exc).lower():
                        raise
                    log.warning("local.node.port_taken", extra={"node": self._nodename, "port": self._port})
                    self._port = free_port()
                    self._dist_port = free_port(exclude=frozenset({self._port}))
                else:
                    self._ports_fixed = True
                    return

    def _start_once(self, deadline: float) -> None:
        self._wait_name_released(min(deadline, time.monotonic() + _EPMD_RELEASE_S))
        self._layout.prepare(self._port, self._config)
        extra_args = "+B i" if self._die_with_owner else "+B i -noinput"
        env = self._layout.env(self._nodename, self._port, self._dist_port, extra_args)
        env["RABBITMQ_ALLOW_INPUT"] = "true"  # exec straight into beam.smp; see the module docstring
        began = time.monotonic()
        self._stdout = open(self._layout.stdout_file, "ab")  # closed in _reap()
        printed_before = self._stdout.seek(0, 2)  # this boot's output starts here
        self._proc = subprocess.Popen(
            [str(sbin_dir() / "rabbitmq-server")],
            env=env,
            cwd=self._layout.base,
            stdin=subprocess.PIPE if self._die_with_owner else subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal must not reach the broker
        )
        # Ready = answers AMQP *and* the listener is our beam's: ports are probed, not reserved, so a
        # node of another session may answer on this port while ours fails with eaddrinuse.
        pid = self._proc.pid
        self._await(
            lambda: speaks_amqp(self.host, self._port, timeout=1.0) and listens_on(pid, self._port),
            ("starting", "start"),
            deadline,
            _POLL_S,
        )
        with open(self._layout.stdout_file, "rb") as printed:

            def booted() -> bool:
                printed.seek(printed_before)
                return _BOOTED in printed.read()

            self._await(booted, ("booting", "finish booting"), deadline, _POLL_S / 4)
        comm = Path(f"/proc/{self._proc.pid}/comm").read_text().strip()
        if comm != "beam.smp":
            self._kill_and_reap()
            raise NodeStartError(f"node {self._nodename}: started process is {comm!r}, not beam.smp")
        log.info(
            "local.node.started",
            extra={
                "node": self._nodename,
                "port": self._port,
                "pid": self._proc.pid,
                "seconds": round(time.monotonic() - began, 2),
            },
        )

    def _await(self, ready: Callable[[], bool], doing: tuple[str, str], deadline: float, poll: float) -> None:
        """Polls ``ready`` every ``poll`` seconds until it holds. The process exiting meanwhile (it
        is reaped) or ``deadline`` passing (it is killed) raises :class:`NodeStartError`, worded
        with ``doing`` ("while starting", "did not start in time")."""
        assert self._proc is not None
        while not ready():
            code = self._proc.poll()
            if code is not None:
                self._reap()
                raise NodeStartError(
                    f"node {self._nodename} exited with {code} while {doing[0]}\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self._kill_and_reap()
                raise NodeStartError(f"node {self._nodename} did not {doing[1]} in time\n" + self.log_tail())
            time.sleep(poll)

    def _wait_name_released(self, deadline: float) -> None:
        # epmd drops a killed node's name when it notices the closed socket; a restart racing that
        # would fail with "name seems to be in use by another Erlang node".
        short = f"name {self._nodename.partition('@')[0]} "
        while short in epmd_names() and time.monotonic() < deadline:
            time.sleep(_POLL_S)

    def kill(self) -> None:
        """Sends SIGKILL to ``beam.smp`` and waits until it is gone. No-op if not running."""
        with self._lock:
            if self._proc is None:
                return
            pid = self._proc.pid
            self._kill_and_reap()
            log.info("local.node.killed", extra={"node": self._nodename, "pid": pid})

    def stop(self, timeout: float = 30.0) -> None:
        """Stops the node gracefully, falling back to SIGKILL after ``timeout`` seconds. No-op if stopped.

        SIGTERM is RabbitMQ's graceful stop (the same shutdown as ``rabbitmqctl stop``), without the
        second or two of CPU that booting ``rabbitmqctl`` costs.
        """
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is None:
                self._signal(signal.SIGCONT)
                self._paused = False
                self._signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.warning("local.node.stop_timeout", extra={"node": self._nodename, "timeout": timeout})
            self._kill_and_reap()
            log.info("local.node.stopped", extra={"node": self._nodename})

    def restart(self, timeout: float = 60.0) -> None:
        """Starts the node again with the same name, ports and data; stops it first if it is running.

        Raises:
            NodeStartError: as :meth:`start`.
        """
        with self._lock:
            self.stop()
            self.start(timeout)

    def pause(self) -> None:
        """Freezes ``beam.smp`` with SIGSTOP: sockets stay open, nothing is answered.

        Raises:
            NodeError: the node is not running.
        """
        with self._lock:
            self._signal(signal.SIGSTOP, required=True)
            self._paused = True

    def resume(self) -> None:
        """Thaws a paused node with SIGCONT.

        Raises:
            NodeError: the node is not running.
        """
        with self._lock:
            self._signal(signal.SIGCONT, required=True)
            self._paused = False

    def _signal(self, sig: signal.Signals, required: bool = False) -> None:
        # Only ever our own child, by pid, and only while it has not been reaped (so the pid is ours).
        proc = self._proc
        if proc is None or proc.poll() is not None:
            if required:
                raise NodeError(f"node {self._nodename} is not running")
            return
        proc.send_signal(sig)

    def _kill_and_reap(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(_KILL_WAIT_S)
            except subprocess.TimeoutExpired as exc:
                raise NodeError(f"node {self._nodename} (pid {proc.pid}) survived SIGKILL") from exc
        self._reap()

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        self._paused = False
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None

    def __enter__(self) -> LocalRabbitNode:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- rabbitmqctl ----------------------------------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 30.0) -> str:
        """Runs ``rabbitmqctl -n <node> <args>`` with this node's HOME and cookie; returns its stdout.

        Raises:
            CtlError: non-zero exit or timeout (the ctl process is killed then).
        """
        env = self._layout.env(self._nodename, self._port, self._dist_port)
        cmd = [str(sbin_dir() / "rabbitmqctl"), "-n", self._nodename, *args]
        try:
            done = subprocess.run(
                cmd,
                env=env,
                cwd=self._layout.base,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CtlError(f"rabbitmqctl {' '.join(args)} timed out after {timeout}s") from exc
        if done.returncode != 0:
            output = f"{done.stdout.strip()} {done.stderr.strip()}".strip()
            raise CtlError(f"rabbitmqctl {' '.join(args)} exited {done.returncode}: {output}")
        return done.stdout

    def set_memory_alarm(self, on: bool) -> None:
        """Raises (watermark 0) or clears (watermark back to the configured limit) the memory alarm.

        While it is on, the broker blocks every connection that publishes; consumers are not blocked.

        Raises:
            CtlError: rabbitmqctl failed.
        """
        limit = self._config["vm_memory_high_watermark.absolute"]
        args = ("0",) if on else ("absolute", limit)
        self.ctl("set_vm_memory_high_watermark", *args)
        log.info("local.node.memory_alarm", extra={"node": self._nodename, "on": on})

    def list_queues(self, vhost: str = "/") -> dict[str, int]:
        """Queue name → ready+unacked message count in ``vhost``.

        Raises:
            CtlError: rabbitmqctl failed or printed something other than the expected JSON.
        """
        out = self.ctl("list_queues", "-p", vhost, "name", "messages", "--formatter", "json", "--silent")
        try:
            rows = json.loads(out.strip() or "[]")
            return {str(row["name"]): int(row.get("messages") or 0) for row in rows}
        except (ValueError, TypeError, KeyError) as exc:
            raise CtlError(f"unexpected list_queues output: {out!r}") from exc
