"""Fixtures for integration tests: real, independent RabbitMQ brokers and fault proxies in front of them.

Starting a broker costs 5-20 s, so there are two kinds:

- ``rabbit_nodes`` (session): two brokers shared by every test that leaves them as it found them. Do
  not kill, stop, pause or alarm them, and use unique queue names (e.g. from ``request.node.name``).
  A test that leaves one down fails in teardown, and the node is restarted for the next test.
- ``fresh_nodes(k)`` (function): ``k`` dedicated brokers that the test may kill -9, restart, pause or
  put under a memory alarm; they are killed and their data deleted at teardown.

``fault_proxy(broker)`` puts a :class:`~truba.local.ThreadedFaultProxy` in front of a broker; connect to
``amqp_url(proxy.host, proxy.port)``. Brokers are local ``rabbitmq-server`` processes, or testcontainers
when a Docker engine answers (``TRUBA_TEST_BROKERS`` forces either). A broker that cannot start fails
the test; nothing here skips.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.brokers import BrokerNode, BrokerNodes, choose_backend
from truba.local import ThreadedFaultProxy
from truba.local.probe import speaks_amqp


@pytest.fixture(scope="session", autouse=True)
def client_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Clients made without ``journal=`` keep their journals under a temporary state folder,
    not the user's ``~/.local/state``."""
    state = tmp_path_factory.mktemp("state")
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)
    yield state
    if previous is None:
        del os.environ["XDG_STATE_HOME"]
    else:
        os.environ["XDG_STATE_HOME"] = previous


@pytest.fixture(scope="session")
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerNodes]:
    """Starts brokers for the whole session and stops every one of them at its end."""
    factory = BrokerNodes(tmp_path_factory.mktemp("rmq"), choose_backend())
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def rabbit_nodes(broker_factory: BrokerNodes) -> list[BrokerNode]:
    """Two independent brokers shared by the session; tests must not inject process faults into them."""
    return broker_factory.start(2)


@pytest.fixture(autouse=True)
def _shared_nodes_left_healthy(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used ``rabbit_nodes``, checks they still answer; restores them and fails if not."""
    yield
    if "rabbit_nodes" not in request.fixturenames:
        return
    nodes: list[BrokerNode] = request.getfixturevalue("rabbit_nodes")
    broken = [node for node in nodes if not speaks_amqp(node.host, node.port, timeout=5.0)]
    for node in broken:
        if getattr(node, "paused", False):
            node.resume()
        if not speaks_amqp(node.host, node.port, timeout=5.0):
            node.restart()
    if broken:
        pytest.fail(f"{request.node.nodeid} left shared brokers down {broken}; use fresh_nodes for faults")


@pytest.fixture
def fresh_nodes(broker_factory: BrokerNodes) -> Iterator[Callable[[int], list[BrokerNode]]]:
    """``fresh_nodes(k)`` starts ``k`` dedicated brokers in parallel; killed and deleted at teardown."""
    started: list[BrokerNode] = []

    def make(count: int = 1) -> list[BrokerNode]:
        brokers = broker_factory.start(count)
        started.extend(brokers)
        return brokers

    try:
        yield make
    finally:
        broker_factory.discard(started)


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[BrokerNode], ThreadedFaultProxy]]:
    """``fault_proxy(broker)`` returns a started proxy in front of ``broker``; all are closed at teardown."""
    proxies: list[ThreadedFaultProxy] = []

    def make(broker: BrokerNode) -> ThreadedFaultProxy:
        proxy = ThreadedFaultProxy(broker.host, broker.port)
        proxy.start()
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()
