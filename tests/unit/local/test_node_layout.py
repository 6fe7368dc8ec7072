"""The environment a local RabbitMQ node is started with (truba.local.layout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from truba.local.layout import NodeLayout


def test_a_local_node_keeps_out_the_machines_settings_and_does_not_spin_its_schedulers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RABBITMQ_NODE_PORT", "5672")
    monkeypatch.setenv("ERL_FLAGS", "+S 64")
    env = NodeLayout(tmp_path).env("n@localhost", 20001, 20002, "+B i")
    args = env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"].split()
    # Its cores are shared with the daemon, its slots and the client: a scheduler out of work
    # sleeps at once instead of spinning on a core they need
    for flag in ("+sbwt", "+sbwtdcpu", "+sbwtdio"):
        assert args[args.index(flag) + 1] == "none"
    assert args[-2:] == ["+B", "i"]
    assert env["RABBITMQ_NODE_PORT"] == "20001" and "ERL_FLAGS" not in env
    assert env["HOME"] == str(tmp_path)
