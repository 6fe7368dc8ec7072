"""Free loopback TCP ports for local brokers and proxies.

Ports are picked *below* the kernel's ephemeral range. Outgoing connections take their local port from that
range, so a port chosen there could be taken by any client between our probe and the node's bind, or
while a killed node is down and waits to be restarted on the same port. Below the range only listeners
compete, and each candidate is probed by binding it.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path
from typing import Final

_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST: Final = 10_000
_DEFAULT_EPHEMERAL_LOW: Final = 32_768
_ATTEMPTS: Final = 200
# Ports already handed out by this process: two nodes constructed back to back must not get the same one.
_handed_out: set[int] = set()
_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens on (or holds) ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", exclude: frozenset[int] = frozenset()) -> int:
    """Returns a TCP port on ``host`` that was free when probed, outside the ephemeral range.

    Another process may still take it before the caller binds it; callers that can, retry on
    ``EADDRINUSE``. Falls back to a kernel-assigned port if no candidate below the range is free.
    """
    high = _ephemeral_low()
    rng = random.SystemRandom()
    with _lock:
        if high - _LOWEST > 1_000:
            for _ in range(_ATTEMPTS):
                port = rng.randrange(_LOWEST, high)
                if port not in exclude and port not in _handed_out and is_free(port, host):
                    _handed_out.add(port)
                    return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        _handed_out.add(port)
        return port
