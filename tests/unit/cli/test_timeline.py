"""``truba timeline``: its output file must be HTML or PNG; a dead scheduler is one line and 69."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from truba.cli import main
from truba.cli.exits import UNAVAILABLE, USAGE


def test_an_output_that_is_neither_html_nor_png_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["timeline", "j-1", "-o", str(tmp_path / "t.svg"), "--scheduler", "127.0.0.1:1"]) == USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must end in .html or .png" in err


def test_a_dead_scheduler_is_one_line_and_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert (
        main(["timeline", "j-1", "--json", "--scheduler", f"127.0.0.1:{port}", "--timeout", "1"])
        == UNAVAILABLE
    )
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("truba timeline: scheduler")
