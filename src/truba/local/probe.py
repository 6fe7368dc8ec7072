"""Cheap readiness checks for a local node: "does this port speak AMQP 0-9-1 yet, and is it ours?"

``rabbitmqctl await_startup`` costs one to two seconds of CPU per call (it boots an Erlang VM and
Elixir). Sending the protocol header and reading the broker's first frame costs a millisecond, and the
AMQP listener is opened at the end of RabbitMQ's boot, once it can serve clients.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Final

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
# A method frame (type 1) on channel 0 carrying connection.start (class 10, method 10).
_FRAME_METHOD: Final = 1
_CONNECTION_START: Final = b"\x00\x0a\x00\x0a"
_PREFIX_LEN: Final = 11
_TCP_LISTEN: Final = "0A"


def speaks_amqp(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if ``host:port`` answers the AMQP 0-9-1 header with ``connection.start``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(PROTOCOL_HEADER)
            data = b""
            while len(data) < _PREFIX_LEN:
                chunk = sock.recv(_PREFIX_LEN - len(data))
                if not chunk:
                    return False
                data += chunk
    except OSError:
        return False
    return data[0] == _FRAME_METHOD and data[1:3] == b"\x00\x00" and data[7:11] == _CONNECTION_START


def listens_on(pid: int, port: int) -> bool:
    """True if process ``pid`` holds a TCP socket listening on ``port`` (IPv4 or IPv6), per ``/proc``.

    Tells our node's listener from another process that grabbed the same port first.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # fields: sl, local_address (hex ip:hex port), rem_address, st (0A = LISTEN), ..., inode
            if len(fields) > 9 and fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in inodes:
                return True
        except OSError:
            continue
    return False
