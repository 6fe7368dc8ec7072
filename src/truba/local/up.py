"""``truba up``: a whole cluster on this machine, in one command, restartable on the same state.

Starts local RabbitMQ nodes (unless ``--broker`` URLs are given), the scheduler and the daemons,
each a process of its own with its log in ``STATE/logs/`` (in the ``--log-level`` and
``--log-format`` given to ``up``, which its own records on stderr use too), prints the addresses
and how to reach the nodes with ``rabbitmqctl``, then supervises them
(:mod:`truba.local.supervise`) until Ctrl-C or SIGTERM, and stops them all in reverse order. With
a command after ``--``, runs it against the cluster (``TRUBA_SCHEDULER`` names the scheduler),
then stops everything and exits with the command's status.

A second run on the same ``--state`` brings the nodes back with the same names, ports and data
and the scheduler on the same address (:mod:`truba.local.up_state`), so jobs and the clients
waiting on them carry on. A run while another holds the state refuses to start and says which
pid holds it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Final

from truba import logs
from truba.local.cluster import LOCAL_CONSUMER_TIMEOUT, LocalCluster
from truba.local.node import LocalRabbitNode, NodeError
from truba.local.nodes import start_all
from truba.local.ports import free_port, is_free
from truba.local.supervise import Supervisor
from truba.local.up_state import SavedCluster, SavedNode, StateInUse, owning, started_at

POLL: Final = 0.25
"""Seconds between two looks at the processes."""
COMMAND_GRACE: Final = 5.0
"""Seconds the command after ``--`` has to end after a Ctrl-C, and again after a SIGTERM."""
NODE_CONFIG: Final = {"log.file.rotation.size": str(10 * 1024 * 1024), "log.file.rotation.count": "2"}
"""The nodes' own logs rotate at 10 MiB, two kept: the same nodes serve every run on a state."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``up`` subcommand."""
    parser = subparsers.add_parser(
        "up",
        help="run a local cluster: brokers, scheduler, daemons",
        description="Run a local cluster: RabbitMQ nodes, the scheduler and daemons, each with its log in "
        "STATE/logs. Restarts a daemon, the scheduler or a node that dies. Run again with the same --state, "
        "it brings the brokers back on the same ports with their data. Ctrl-C or SIGTERM stops everything.",
    )
    parser.add_argument("--brokers", type=int, default=2, metavar="N", help="local RabbitMQ nodes to start")
    parser.add_argument(
        "--broker",
        action="append",
        default=[],
        metavar="AMQP_URL",
        help="use this broker instead (repeatable)",
    )
    parser.add_argument("--daemons", type=int, default=2, metavar="N", help="daemons to start (default 2)")
    parser.add_argument(
        "--slots", type=int, default=max(1, (os.cpu_count() or 2) // 2), metavar="N", help="slots per daemon"
    )
    parser.add_argument(
        "--allow",
        action="append",
        required=True,
        metavar="PATTERN",
        help="handler pattern the daemons may import (repeatable)",
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="scheduler address (port 0: a free one, kept for the next run on this state)",
    )
    parser.add_argument(
        "--state",
        default=".truba",
        metavar="DIR",
        help="brokers' data, scheduler state, logs (.truba)",
    )
    logs.add_arguments(
        parser,
        note="; given to the scheduler and daemons it starts (their logs: STATE/logs), while up's own"
        " records show from warning up",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND to run against the cluster")
    parser.set_defaults(func=main)


def _nodes(state: Path, count: int, saved: SavedCluster) -> list[LocalRabbitNode]:
    """``count`` nodes: the saved ones first (same name, ports, data), new ones for the rest."""
    nodes = []
    for i in range(count):
        base = state / "brokers" / f"n{i}"
        if i < len(saved.nodes):
            old = saved.nodes[i]
            if is_free(old.port) and is_free(old.dist_port):
                nodes.append(
                    LocalRabbitNode(base, old.name, old.port, dist_port=old.dist_port, config=NODE_CONFIG)
                )
                continue
            _say(f"port {old.port} of broker {old.name} is taken: it moves to another port")
            nodes.append(LocalRabbitNode(base, old.name, config=NODE_CONFIG))
        else:
            nodes.append(LocalRabbitNode(base, config=NODE_CONFIG))
    return nodes


def _listen(requested: str, saved: SavedCluster) -> str:
    """``requested``; with port 0 the address the last run served on if it is free, else a free
    port below the ephemeral range (so that the next run can have it again)."""
    host, _, port = requested.rpartition(":")
    if port != "0":
        return requested
    old_host, _, old_port = saved.scheduler.rpartition(":")
    if (
        old_host == host
        and old_port.isdigit()
        and _bindable(host, int(old_port))
        and _bindable(host, int(old_port) + 1)
    ):
        return saved.scheduler
    while True:  # the scheduler's HTTP takes the next port (truba.scheduler.cli.http_address)
        port_ = free_port(host)
        if _bindable(host, port_ + 1):
            return f"{host}:{port_}"


def _bindable(host: str, port: int) -> bool:
    """The scheduler could bind ``host:port`` now (gRPC binds with SO_REUSEADDR, so TIME_WAIT is no bar)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _save(cluster: LocalCluster, state: Path) -> None:
    """Writes the layout; a run on ``--broker`` URLs keeps the saved local nodes for the next one."""
    nodes = [SavedNode(n.nodename, n.port, n.dist_port) for n in cluster.nodes]
    SavedCluster(
        nodes=nodes or SavedCluster.load(state).nodes,
        scheduler=cluster.address,
        pids=[(p.pid, started_at(p.pid)) for p in cluster.processes],
    ).save(state)


def start(args: argparse.Namespace) -> LocalCluster:
    """Starts brokers, scheduler and daemons as ``args`` say; the caller must ``stop()`` it."""
    state = Path(args.state).resolve()
    saved = SavedCluster.load(state)
    listen = _listen(args.listen, saved)
    host, _, port = listen.rpartition(":")
    for taken in (int(port), int(port) + 1) if port.isdigit() else ():
        if not _bindable(host, taken):
            what = "" if taken == int(port) else f" (its port {taken} serves the scheduler's dashboard)"
            raise RuntimeError(
                f"{host}:{taken} is taken{what} (another truba up or scheduler?); stop it, or pass "
                f"--listen {host}:0 for free ports"
            )
    cluster = LocalCluster(state, log_args=log_args(args))
    try:
        urls = list(args.broker)
        scheduler_args: list[str] = []
        if not urls:
            began = time.monotonic()
            cluster.nodes = _nodes(state, args.brokers, saved)
            start_all(cluster.nodes)
            urls = [node.url for node in cluster.nodes]
            _save(cluster, state)
            again = " (same ports and data as the last run)" if saved.nodes else ""
            _say(f"brokers: {' '.join(urls)} (started in {time.monotonic() - began:.1f} s){again}")
            for node in cluster.nodes:
                cookie = node.base_dir / ".erlang.cookie"
                _say(
                    f"  {node.nodename}: rabbitmqctl -n {node.nodename} "
                    f'--erlang-cookie "$(cat {cookie})" list_queues'
                )
            scheduler_args = ["--consumer-timeout", str(LOCAL_CONSUMER_TIMEOUT)]
        cluster.start_scheduler(urls, listen, *scheduler_args)
        _save(cluster, state)
        _say(f"scheduler: {cluster.address}")
        if cluster.http:
            _say(f"dashboard: {cluster.http}")
        for i in range(args.daemons):
            cluster.start_daemon(f"daemon-{i}", args.slots, args.allow)
        _save(cluster, state)
        cluster.wait_for_daemons(args.daemons)
        allowed = " ".join(args.allow)
        _say(f"daemons: {args.daemons} × {args.slots} slots, allow {allowed}; logs in {state}/logs")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def log_args(args: argparse.Namespace) -> list[str]:
    """``--log-level`` and ``--log-format`` as ``up`` got them, for the scheduler and daemons."""
    return ["--log-level", args.log_level, "--log-format", args.log_format]


def main(args: argparse.Namespace) -> int:
    """Runs ``truba up``; exit status 0 on Ctrl-C/SIGTERM, the command's status with ``--``, 1 when
    the cluster cannot start (another holds the state, a process failed)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]

    def request_stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, request_stop)
    state = Path(args.state).resolve()
    try:
        with owning(state):
            return _run(args, state, command)
    except StateInUse as exc:
        _say(f"error: {exc}")
        return 1


def _run(args: argparse.Namespace, state: Path, command: list[str]) -> int:
    try:
        cluster = start(args)
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, NodeError) as exc:
        _say(f"error: {str(exc).splitlines()[0]}")
        return 1
    supervisor = Supervisor(cluster, _say, on_restart=lambda: _save(cluster, state))
    child: subprocess.Popen[bytes] | None = None
    # From here a stop only raises a flag that the loop reads: a KeyboardInterrupt raised inside
    # Popen would leave the command running with no one to end it.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    try:
        if command:
            env = {**os.environ, "TRUBA_SCHEDULER": cluster.address}
            child = subprocess.Popen(command, env=env)
            _say(f"running: {' '.join(command)}")
        else:
            _say("cluster is up; Ctrl-C to stop")
        while not stop.is_set() and (child is None or child.poll() is None):
            stop.wait(POLL)
            supervisor.check()
        if not stop.is_set() and child is not None:
            return child.returncode
        if child is not None:
            _end(child)
        return 130 if command else 0
    except KeyboardInterrupt:  # a stop before the handlers above were set
        if child is not None:
            _end(child)
        return 130 if command else 0
    finally:
        _say("stopping")
        cluster.stop()
        _say("stopped")


def _end(child: subprocess.Popen[bytes]) -> None:
    """Ends the command: a Ctrl-C in the terminal reached it too, a SIGTERM only us. It gets
    :data:`COMMAND_GRACE` seconds, then SIGTERM, then SIGKILL."""
    for stop in (None, child.terminate, child.kill):
        if stop is not None:
            stop()
        try:
            child.wait(COMMAND_GRACE)
            return
        except subprocess.TimeoutExpired:
            continue


def _say(text: str) -> None:
    print(f"truba up: {text}", flush=True)
