"""A local cluster's process that outlives SIGTERM is logged, then killed."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from truba.local.cluster import TrubaProcess

IGNORES_SIGTERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " print('ready', flush=True); time.sleep(60)"
)


def test_a_process_still_running_after_sigterm_is_logged_and_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    popen = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    assert popen.stdout is not None and popen.stdout.readline() == b"ready\n"
    process = TrubaProcess("stubborn", popen, tmp_path / "stubborn.log")
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="truba.local.cluster"):
        process.terminate(timeout=0.5)
    assert popen.returncode == -9 and time.monotonic() - began < 10
    (record,) = [r for r in caplog.records if r.getMessage() == "local.process.killed"]
    assert (record.__dict__["truba_process"], record.__dict__["pid"]) == ("stubborn", popen.pid)
    popen.stdout.close()
