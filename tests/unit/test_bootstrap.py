"""scripts/bootstrap prints what it does, not the ~90 lines of build warnings pip relays."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_PYTHON = """#!/bin/sh
# Stands in for .venv/bin/python: `-m pip install` prints setuptools-like warnings, then
# succeeds unless PIP_FAILS is set; anything else succeeds quietly.
if [ "$1 $2 $3" = "-m pip install" ]; then
  i=0
  while [ $i -lt 30 ]; do
    echo "  !!"; echo "  ********"; echo "  Please use a simple string containing a SPDX expression"
    i=$((i + 1))
  done >&2
  [ -z "$PIP_FAILS" ] || { echo "ERROR: the real cause" >&2; exit 1; }
fi
exit 0
"""


def bootstrap(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    root = tmp_path / "checkout"
    for folder in ("scripts", "src", "scheduler", "daemon", "pipes", "client", "proto"):
        (root / folder).mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "bootstrap", root / "scripts" / "bootstrap")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return subprocess.run(
        [str(root / "scripts" / "bootstrap")],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


@pytest.mark.skipif(not Path("/usr/lib/rabbitmq/lib").exists(), reason="bootstrap would install RabbitMQ")
def test_a_first_bootstrap_prints_one_line_not_the_build_warnings(tmp_path: Path) -> None:
    done = bootstrap(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).splitlines() == [
        "bootstrap: installing truba with dev extras into .venv"
    ]


@pytest.mark.skipif(not Path("/usr/lib/rabbitmq/lib").exists(), reason="bootstrap would install RabbitMQ")
def test_a_failed_install_shows_the_end_of_pips_output(tmp_path: Path) -> None:
    done = bootstrap(tmp_path, PIP_FAILS="1")
    assert done.returncode == 1
    assert "ERROR: the real cause" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("bootstrap: pip install failed; the whole output is in")
