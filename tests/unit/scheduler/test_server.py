"""The Scheduler process without brokers: config, binding, the state-directory lock, the CLI."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from truba.scheduler import Scheduler, SchedulerConfig
from truba.scheduler import cli as scheduler_cli

NO_BROKER = "amqp://guest:guest@127.0.0.1:1/"


def config(state_dir: Path, listen: str = "127.0.0.1:0") -> SchedulerConfig:
    return SchedulerConfig(brokers=[NO_BROKER], state_dir=state_dir, listen=listen)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"brokers": []}, "brokers: at least one"),
        ({"listen": "50051"}, "listen: must look like HOST:PORT"),
        ({"listen": "host:port"}, "listen: must look like HOST:PORT"),
        ({"heartbeat_interval": 0.0}, "heartbeat_interval: must be > 0"),
    ],
)
def test_bad_configs_are_refused(tmp_path: Path, changes: dict[str, object], error: str) -> None:
    arguments: dict[str, object] = {"brokers": [NO_BROKER], "state_dir": tmp_path, **changes}
    with pytest.raises(ValueError, match=error):
        SchedulerConfig(**arguments)  # type: ignore[arg-type]


def test_defaults_listen_on_loopback() -> None:
    cfg = SchedulerConfig(brokers=[NO_BROKER], state_dir=Path("s"))
    assert (cfg.listen, cfg.heartbeat_interval, cfg.brokers) == ("127.0.0.1:50051", 2.0, (NO_BROKER,))


async def test_port_zero_serves_on_a_free_port(tmp_path: Path) -> None:
    scheduler = Scheduler(config(tmp_path))
    with pytest.raises(RuntimeError, match="not started"):
        _ = scheduler.port
    async with scheduler:
        assert scheduler.port > 0
        assert scheduler.address == f"127.0.0.1:{scheduler.port}"
    await scheduler.stop()  # idempotent


async def test_a_taken_port_or_state_dir_fails_start(tmp_path: Path) -> None:
    async with Scheduler(config(tmp_path / "a")) as first:
        with pytest.raises(RuntimeError, match="Failed to bind"):
            await Scheduler(config(tmp_path / "b", listen=first.address)).start()
        with pytest.raises(RuntimeError, match="in use by another scheduler"):
            await Scheduler(config(tmp_path / "a")).start()
    # Both are free again once the first stopped
    async with Scheduler(config(tmp_path / "a")):
        pass


def test_the_cli_parses_its_options() -> None:
    parser = argparse.ArgumentParser(prog="truba")
    scheduler_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "scheduler",
            "--broker",
            "amqp://a/",
            "--broker",
            "amqp://b/",
            "--state",
            "/tmp/s",
            "--log-format",
            "text",
        ]
    )
    assert args.brokers == ["amqp://a/", "amqp://b/"]
    assert (args.listen, args.state, args.heartbeat_interval) == ("127.0.0.1:50051", Path("/tmp/s"), 2.0)
    assert args.func is scheduler_cli.main
    with pytest.raises(SystemExit):
        parser.parse_args(["scheduler"])  # --broker is required


def test_the_default_state_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert scheduler_cli.default_state_dir() == tmp_path / "truba" / "scheduler"
