"""Schedulers in high availability on one PostgreSQL, as real processes, for the HA tests and
``bench/failover.py``: start them on fixed ports, wait for who leads, read their log events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from truba.local import free_port
from truba.local.cluster import LocalCluster, TrubaProcess
from truba.scheduler.ha import LEADING_LINE

READY = "truba scheduler listening on "


def events(process: TrubaProcess, name: str) -> list[dict[str, Any]]:
    """The JSON log records of ``process`` (this start and earlier re-execs) with event ``name``."""
    found = []
    for line in process.log().splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            record = json.loads(line)
            if record.get("event") == name:
                found.append(record)
    return found


class Schedulers:
    """``count`` schedulers on one database, each on its own fixed port and state folder."""

    def __init__(self, local: LocalCluster, brokers: list[str], store: str, count: int = 2) -> None:
        self.local = local
        self.brokers = brokers
        self.store = store
        self.ports = [free_port() for _ in range(count)]
        self.processes: dict[int, TrubaProcess] = {}

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    @property
    def address(self) -> str:
        """Every scheduler's address, comma-separated (what clients and daemons are given)."""
        return ",".join(self.addresses)

    def start(self, index: int, *extra: str, store: str | None = None) -> TrubaProcess:
        """Starts scheduler ``index`` and waits until it serves (as leader or standby)."""
        broker_args = [arg for url in self.brokers for arg in ("--broker", url)]
        process = self.local.spawn(
            f"scheduler-{index}",
            [
                "scheduler",
                "--listen",
                self.addresses[index],
                "--http",
                "off",
                *broker_args,
                "--state",
                str(self.local.state / f"scheduler-{index}"),
                "--store",
                store or self.store,
                "--heartbeat-interval",
                "0.5",
                *extra,
            ],
        )
        self.processes[index] = process
        wait_for_line(process, READY)
        return process

    def leader(self, timeout: float = 10.0, *, not_: TrubaProcess | None = None) -> TrubaProcess:
        """The scheduler that printed the leading line last (other than ``not_``)."""
        deadline = time.monotonic() + timeout
        while True:
            for process in self.processes.values():
                if process is not not_ and process.alive() and LEADING_LINE in process.log():
                    return process
            if time.monotonic() > deadline:
                raise AssertionError(f"no scheduler leads after {timeout:g} s")
            time.sleep(0.02)

    def __iter__(self) -> Iterator[TrubaProcess]:
        return iter(self.processes.values())


def wait_for_line(process: TrubaProcess, text: str, timeout: float = 30.0, *, after: int = 0) -> None:
    """Waits until ``text`` appears in the process's log past offset ``after`` (characters)."""
    deadline = time.monotonic() + timeout
    while text not in process.log()[after:]:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited; see {process.log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{process.name}: no {text!r} after {timeout:g} s; see {process.log_path}")
        time.sleep(0.02)


def logs(local: LocalCluster, tail: int = 6000) -> str:
    return "\n".join(f"--- {p.name}\n{p.log()[-tail:]}" for p in local.processes)
