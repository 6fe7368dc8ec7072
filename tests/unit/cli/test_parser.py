"""The command line itself: every verb described, every address flag explained and defaulting
to $TRUBA_SCHEDULER, addresses without a port on 50051, one-line errors with sysexits codes."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc
import pytest

from truba.channel import scheduler_target
from truba.cli import build_parser, main
from truba.cli.exits import FAILURE, NOPERM, UNAVAILABLE, USAGE, CliError, rpc_failed
from truba.local import up
from truba.local.cluster import LocalCluster

ASKING = [
    ["status"],
    ["jobs"],
    ["job", "j-1"],
    ["cancel", "j-1"],
    ["daemons"],
    ["drain", "d-1"],
    ["job", "j-1", "--dead"],
    ["job", "j-1", "--running"],
    ["top"],
]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_verb_has_a_description_and_its_options_a_help() -> None:
    # `truba up --help` and `truba daemon --help` used to say nothing of what they do, and
    # `--daemons` and `--scheduler` had no help
    verbs = subparsers(build_parser())
    for name, sub in verbs.items():
        assert sub.description, f"truba {name} has no description"
        scheduler = [a for a in sub._actions if "--scheduler" in a.option_strings]
        assert all(a.help for a in scheduler), f"truba {name} --scheduler has no help"
    for name in ["up", "status", "jobs", "job", "cancel", "daemons", "drain", "top"]:
        for action in verbs[name]._actions:
            assert action.help, f"truba {name} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize("argv", [*ASKING, ["daemon", "--allow", "x.*"]])
def test_truba_scheduler_is_the_default_address_of_every_verb(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRUBA_SCHEDULER", "sched.example:6000")
    assert build_parser().parse_args(argv).scheduler == "sched.example:6000"
    monkeypatch.delenv("TRUBA_SCHEDULER")
    assert build_parser().parse_args(argv).scheduler == "127.0.0.1:50051"


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("localhost", "localhost:50051"),
        ("sched.example", "sched.example:50051"),
        ("10.0.0.5", "10.0.0.5:50051"),
        ("10.0.0.5:7000", "10.0.0.5:7000"),
        ("[::1]", "[::1]:50051"),
        ("[::1]:7000", "[::1]:7000"),
        ("::1", "[::1]:50051"),
        ("unix:/run/truba.sock", "unix:/run/truba.sock"),
        ("dns:///sched.example:7000", "dns:///sched.example:7000"),
    ],
)
def test_an_address_without_a_port_means_50051_not_443(given: str, target: str) -> None:
    assert scheduler_target(given) == target


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [
        (grpc.StatusCode.UNAVAILABLE, UNAVAILABLE),
        (grpc.StatusCode.DEADLINE_EXCEEDED, UNAVAILABLE),
        (grpc.StatusCode.INVALID_ARGUMENT, USAGE),
        (grpc.StatusCode.UNAUTHENTICATED, NOPERM),
        (grpc.StatusCode.NOT_FOUND, FAILURE),
        (grpc.StatusCode.FAILED_PRECONDITION, FAILURE),
        (grpc.StatusCode.INTERNAL, FAILURE),
    ],
)
def test_a_failed_call_is_one_line_with_a_sysexits_code(code: grpc.StatusCode, exit_code: int) -> None:
    error = rpc_failed(_Failed(code, "first line\n  second line"), "h:1", 3.0)
    assert isinstance(error, CliError)
    assert error.exit_code == exit_code
    assert "\n" not in str(error)


def test_a_command_error_is_printed_on_one_line_with_its_exit_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(args: argparse.Namespace) -> int:
        raise CliError("scheduler h:1: unreachable (refused)", UNAVAILABLE)

    monkeypatch.setattr("truba.cli.jobs.list_jobs", fail)
    assert main(["jobs"]) == UNAVAILABLE
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "truba jobs: scheduler h:1: unreachable (refused)\n"


def test_a_bad_command_line_exits_2() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["job"])  # the id is missing
    assert exited.value.code == USAGE


def test_every_command_takes_log_level_and_log_format_with_help_and_documented_defaults() -> None:
    # `truba up` and the verbs that ask the scheduler had no log flags; the daemon's had no help
    verbs = subparsers(build_parser())
    for name, sub in verbs.items():
        flags = {a.dest: a for a in sub._actions if a.dest in ("log_level", "log_format")}
        assert sorted(flags) == ["log_format", "log_level"], f"truba {name} lacks a log flag"
        for action in flags.values():
            assert action.help and f"(default: {action.default})" in action.help, (name, action.dest)
    for name in ("scheduler", "daemon", "up"):
        defaults = verbs[name].get_default("log_level"), verbs[name].get_default("log_format")
        assert defaults == ("info", "json"), name
    args = build_parser().parse_args(["jobs"])
    assert (args.log_level, args.log_format) == ("warning", "text")


def test_truba_up_gives_its_log_flags_to_the_scheduler_and_daemons_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[list[str]] = []
    monkeypatch.setattr(LocalCluster, "spawn", lambda self, name, args, env=None: spawned.append(args))
    monkeypatch.setattr(LocalCluster, "_wait_for_ready", lambda self, process: "127.0.0.1:1")
    monkeypatch.setattr(LocalCluster, "_http_of", staticmethod(lambda process: ""))
    args = build_parser().parse_args(["up", "--allow", "x.*", "--log-level", "debug", "--log-format", "text"])
    cluster = LocalCluster(tmp_path, log_args=up.log_args(args))
    cluster.start_scheduler(["amqp://b/"])
    cluster.start_daemon("d0", 1, ["x.*"], "--log-level", "warning")
    scheduler, daemon = (build_parser().parse_args(argv) for argv in spawned)
    assert (scheduler.log_level, scheduler.log_format) == ("debug", "text")
    assert (daemon.log_level, daemon.log_format) == ("warning", "text")  # a start's own flags win


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["job", "j-1", "--limit", "5"], "truba job: --limit goes with --dead\n"),
        (["job", "j-1", "--dead", "--limit", "0"], "truba job: --limit must be 1 to 1000, not 0\n"),
        (["job", "j-1", "--dead", "--running"], "truba job: --dead and --running: one at a time\n"),
        (["top", "--interval", "0"], "truba top: --interval must be > 0 and --count >= 0\n"),
    ],
)
def test_a_bad_dead_limit_or_top_interval_is_one_line_and_exit_2_before_asking_anyone(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRUBA_SCHEDULER", "127.0.0.1:1")  # nobody there: asking would exit 69
    assert main(argv) == USAGE
    assert capsys.readouterr().err == said
