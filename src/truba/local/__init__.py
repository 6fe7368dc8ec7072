"""Local RabbitMQ brokers and network faults, for ``truba up`` and the test suite.

- :class:`LocalRabbitNode`: one independent ``rabbitmq-server`` on a free loopback port, with process
  faults (kill -9, restart, pause/resume, memory alarm). :func:`start_nodes` starts several in parallel.
- :class:`FaultProxy`: an asyncio TCP proxy with Toxiproxy-style faults (stall, cut, refuse, latency,
  bandwidth); :class:`ThreadedFaultProxy` runs one on its own loop behind a blocking API.
"""

from __future__ import annotations

from truba.local.epmd import unique_nodename
from truba.local.node import CtlError, LocalRabbitNode, NodeError, NodeStartError
from truba.local.nodes import start_nodes, stop_nodes
from truba.local.ports import free_port
from truba.local.proxy import Direction, FaultProxy
from truba.local.proxy_thread import ThreadedFaultProxy

__all__ = [
    "CtlError",
    "Direction",
    "FaultProxy",
    "LocalRabbitNode",
    "NodeError",
    "NodeStartError",
    "ThreadedFaultProxy",
    "free_port",
    "start_nodes",
    "stop_nodes",
    "unique_nodename",
]
