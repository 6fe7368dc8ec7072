"""`truba up` refuses at once, on one line, when its scheduler address is taken."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from truba.cli import main


def test_truba_up_on_a_taken_address_says_so_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to boot the brokers, then say "scheduler exited with 1; see …/scheduler.log"
    handler = signal.getsignal(signal.SIGTERM)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        try:
            status = main(["up", "--allow", "x.*", "--state", str(tmp_path), "--listen", address])
        finally:
            signal.signal(signal.SIGTERM, handler)
    assert status == 1
    assert capsys.readouterr().out == (
        f"truba up: error: {address} is taken (another truba up or scheduler?); stop it, or pass "
        "--listen 127.0.0.1:0 for free ports\n"
    )
    assert not (tmp_path / "brokers").exists()


def test_truba_up_whose_dashboard_port_is_taken_says_so_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            status = main(
                ["up", "--allow", "x.*", "--state", str(tmp_path), "--listen", f"127.0.0.1:{port - 1}"]
            )
        finally:
            signal.signal(signal.SIGTERM, handler)
    assert status == 1
    assert (
        f"127.0.0.1:{port} is taken (its port {port} serves the scheduler's dashboard)"
        in capsys.readouterr().out
    )
    assert not (tmp_path / "brokers").exists()
