"""docker-compose.yml cannot run here (no Docker engine), so check what can be checked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from truba.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return data


def _truba_argv(command: list[str]) -> list[str]:
    return command[1:] if command and command[0] == "truba" else command


def test_services_are_two_brokers_a_scheduler_and_two_daemons(compose: dict[str, Any]) -> None:
    services = compose["services"]
    commands = {name: (svc.get("command") or [None])[0] for name, svc in services.items()}
    assert sorted(c for c in commands.values() if c) == ["daemon", "daemon", "scheduler"]
    brokers = [name for name, svc in services.items() if "rabbitmq" in str(svc.get("image", ""))]
    assert len(brokers) == 2
    for name in brokers:
        assert "healthcheck" in services[name]
        timeout = re.search(r"consumer_timeout (\d+)", str(services[name]["environment"]))
        assert timeout and int(timeout.group(1)) > 1_800_000, "consumer_timeout must be raised above 30 min"


def test_every_truba_command_and_healthcheck_parses_with_the_real_cli(compose: dict[str, Any]) -> None:
    parser = build_parser()
    checked = 0
    for name, svc in compose["services"].items():
        if "build" not in svc:
            continue
        args = parser.parse_args(_truba_argv(svc["command"]))
        assert callable(args.func), name
        checked += 1
        health = svc.get("healthcheck", {}).get("test")
        if health:
            assert health[:2] == ["CMD", "truba"]
            parser.parse_args(health[2:])
    assert checked == 3


def test_broker_urls_name_the_broker_services(compose: dict[str, Any]) -> None:
    command = compose["services"]["scheduler"]["command"]
    urls = [command[i + 1] for i, arg in enumerate(command) if arg == "--broker"]
    hosts = {re.sub(r"^amqp://[^@]*@([^:/]+).*$", r"\1", url) for url in urls}
    assert hosts == {"rmq1", "rmq2"}


def test_the_dockerfile_installs_every_package_folder_and_sets_no_pythonpath() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for folder in ("src", "scheduler", "daemon", "pipes", "client", "proto", "examples"):
        assert f"COPY {folder} {folder}" in dockerfile
        assert (REPO / folder).is_dir()
    assert "PYTHONPATH" not in dockerfile.replace("no source folder on PYTHONPATH", "")
    assert "pip wheel" in dockerfile and "./examples" in dockerfile


def test_the_scheduler_is_told_the_brokers_consumer_timeout_and_the_brokers_set_their_alarms(
    compose: dict[str, Any],
) -> None:
    # The scheduler assumed RabbitMQ's 30 min and refused jobs the brokers would have run
    services = compose["services"]
    command = services["scheduler"]["command"]
    told = float(command[command.index("--consumer-timeout") + 1])
    for name in ("rmq1", "rmq2"):
        args = str(services[name]["environment"]["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"])
        timeout = re.search(r"consumer_timeout (\d+)", args)
        assert timeout and int(timeout.group(1)) / 1000 == told
        assert re.search(r"vm_memory_high_watermark 0\.\d+\b", args) and re.search(
            r"disk_free_limit \d+", args
        )


def test_the_monitoring_profile_scrapes_the_schedulers_http_port_and_mounts_files_that_exist(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    command = services["scheduler"]["command"]
    http_port = command[command.index("--http") + 1].rsplit(":", 1)[1]
    assert f"127.0.0.1:{http_port}:{http_port}" in services["scheduler"]["ports"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]  # a plain `up` runs truba alone
        for volume in services[name]["volumes"]:
            assert (REPO / volume.split(":")[0]).exists(), volume
    config = yaml.safe_load((REPO / "docs" / "prometheus" / "prometheus.yml").read_text())
    (scrape,) = config["scrape_configs"]
    assert scrape["job_name"] == "truba-scheduler"  # the rules' TrubaSchedulerDown names it
    assert scrape["static_configs"][0]["targets"] == [f"scheduler:{http_port}"]
    assert config["rule_files"] == ["truba-rules.yml"]


def test_the_daemons_run_under_an_init_that_reaps_orphans(compose: dict[str, Any]) -> None:
    # As PID 1 the daemon would inherit every orphan in its container and reap only its slots.
    daemons = [svc for svc in compose["services"].values() if (svc.get("command") or [None])[0] == "daemon"]
    assert len(daemons) == 2
    assert all(svc.get("init") is True for svc in daemons)


def test_the_brokers_share_the_hosts_cores_without_spinning_schedulers(compose: dict[str, Any]) -> None:
    # They run beside the daemons: a busy-waiting Erlang scheduler takes a core a slot needs
    for name in ("rmq1", "rmq2"):
        args = str(compose["services"][name]["environment"]["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"])
        assert all(f"{flag} none" in args for flag in ("+sbwt", "+sbwtdcpu", "+sbwtdio")), args
