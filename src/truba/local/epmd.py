"""Node names on this host: unique ones for new nodes, and the ones epmd has registered."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
from typing import Final

_COUNTER: Final = itertools.count()


def unique_nodename(prefix: str = "truba") -> str:
    """A node name no other node on this host uses: ``<prefix>-<pid>-<n>-<random>@localhost``."""
    return f"{prefix}-{os.getpid()}-{next(_COUNTER)}-{secrets.token_hex(3)}@localhost"


def epmd_names() -> str:
    """``epmd -names`` (the Erlang nodes registered on this host), or "" when it cannot tell."""
    epmd = shutil.which("epmd")
    if epmd is None:
        return ""
    try:
        done = subprocess.run([epmd, "-names"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout
