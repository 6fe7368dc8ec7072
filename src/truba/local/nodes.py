"""Several independent local RabbitMQ nodes at once: started and stopped in parallel threads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from truba.local.node import LocalRabbitNode


def start_nodes(
    base_dir: Path,
    count: int,
    timeout: float = 60.0,
    *,
    config: Mapping[str, str] | None = None,
    die_with_owner: bool = True,
) -> list[LocalRabbitNode]:
    """Starts ``count`` nodes in parallel, in ``base_dir/n0`` … ``base_dir/n<count-1>``.

    Raises:
        NodeStartError: a node failed to start; the nodes that did start are stopped first.
    """
    nodes = [
        LocalRabbitNode(Path(base_dir) / f"n{i}", config=config, die_with_owner=die_with_owner)
        for i in range(count)
    ]
    start_all(nodes, timeout)
    return nodes


def start_all(nodes: Iterable[LocalRabbitNode], timeout: float = 60.0) -> None:
    """Starts the given nodes in parallel.

    Raises:
        NodeStartError: a node failed to start; the nodes that did start are stopped first.
    """
    nodes = list(nodes)
    if not nodes:
        return
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="truba-node-start") as pool:
        futures = [pool.submit(node.start, timeout) for node in nodes]
        errors = [exc for exc in (future.exception() for future in futures) if exc is not None]
    if errors:
        stop_nodes(nodes)
        raise errors[0]


def stop_nodes(nodes: Iterable[LocalRabbitNode], timeout: float = 30.0) -> None:
    """Stops the nodes in parallel (graceful, SIGKILL after ``timeout``); stopped ones are skipped."""
    nodes = list(nodes)
    if not nodes:
        return
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="truba-node-stop") as pool:
        for future in [pool.submit(node.stop, timeout) for node in nodes]:
            future.result()
