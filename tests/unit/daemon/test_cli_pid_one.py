"""A daemon started as PID 1 (a container without an init) says what it does not do."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

import pytest

from truba.cli import build_parser
from truba.daemon import cli


def _run_nothing(main: Coroutine[Any, Any, int]) -> int:
    main.close()
    return 0


@pytest.mark.parametrize("pid", [1, 4242])
def test_a_daemon_running_as_pid_1_warns_that_orphans_of_handlers_stay_zombies(
    pid: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("truba.daemon.cli.os.getpid", lambda: pid)
    monkeypatch.setattr("truba.daemon.cli.asyncio.run", _run_nothing)
    monkeypatch.setattr("truba.daemon.cli.logs.setup", lambda *args: None)  # keeps caplog's handler
    monkeypatch.setattr("truba.daemon.cli.logs.bind_process", lambda **fields: None)  # binds for good
    args = build_parser().parse_args(["daemon", "--allow", "x:*"])
    with caplog.at_level(logging.WARNING, logger="truba.daemon.cli"):
        assert cli.main(args) == 0
    warned = [r for r in caplog.records if r.message == "daemon.pid_one"]
    assert len(warned) == (pid == 1)
    if warned:
        assert "init" in vars(warned[0])["advice"]
