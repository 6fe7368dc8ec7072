"""The files and environment of one local RabbitMQ node: everything lives under one directory.

The node must not read anything from the machine's own broker (``/etc/rabbitmq/*``, ``$HOME``), so every
path RabbitMQ would otherwise default is pointed into the node's directory, and inherited
``RABBITMQ_*``/``ERL_*FLAGS`` variables are dropped. ``ERL_EPMD_PORT``/``ERL_EPMD_ADDRESS`` are kept as
they are: all nodes on the host share one epmd.
"""

from __future__ import annotations

import glob
import os
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

SBIN_ENV: Final = "TRUBA_RABBITMQ_SBIN"
_SBIN_GLOB: Final = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"
_DROPPED_ENV: Final = frozenset({"ERL_FLAGS", "ERL_AFLAGS", "ERL_ZFLAGS", "NOTIFY_SOCKET", "HOME"})
_COOKIE_ALPHABET: Final = string.ascii_uppercase
_ERROR_LINES: Final = 20
_LOOPBACK_DIST: Final = "-kernel inet_dist_use_interface {127,0,0,1}"  # else the dist port binds 0.0.0.0
NO_BUSY_WAIT: Final = "+sbwt none +sbwtdcpu none +sbwtdio none"
"""Erlang flags: a scheduler thread that runs out of work sleeps at once instead of spinning a
while first. A local node shares the machine's cores with the daemon, its slots and the client,
and a spinning scheduler takes a core they need after every burst of messages (RabbitMQ's
runtime guide recommends this on shared hosts). W1 of ``bench/e2e.py --w1-only`` on a 2-core
machine, the flags toggled in one tree, 9 interleaved runs each: truba/raw median 7.40x with
spinning, 8.84x without (ranges 6.1-8.9x and 6.2-10.9x: a noisy machine)."""

DEFAULT_CONFIG: Final[Mapping[str, str]] = {
    "loopback_users": "none",
    "vm_memory_high_watermark.absolute": "1GB",
    "consumer_timeout": "7200000",
}


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name.rpartition("-")[2]
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def sbin_dir() -> Path:
    """The directory holding the real ``rabbitmq-server``/``rabbitmqctl`` scripts.

    ``/usr/sbin/rabbitmq-server`` switches to the ``rabbitmq`` user when run as root, so the versioned
    scripts are called directly. ``$TRUBA_RABBITMQ_SBIN`` overrides the search.

    Raises:
        FileNotFoundError: no RabbitMQ installation was found.
    """
    override = os.environ.get(SBIN_ENV)
    if override:
        return Path(override)
    found = sorted(glob.glob(_SBIN_GLOB), key=_version_key)
    if not found:
        raise FileNotFoundError(f"no RabbitMQ server scripts at {_SBIN_GLOB}; install rabbitmq-server")
    return Path(found[-1])


@dataclass(frozen=True)
class NodeLayout:
    """Paths of one node's files under ``base``, and the environment its scripts run with."""

    base: Path

    @property
    def mnesia_base(self) -> Path:
        """Parent of the node's database directory (``<mnesia_base>/<nodename>``)."""
        return self.base / "mnesia"

    @property
    def log_base(self) -> Path:
        """Directory of the node's log file (``<log_base>/<nodename>.log``)."""
        return self.base / "log"

    @property
    def config_file(self) -> Path:
        """The node's ``rabbitmq.conf``."""
        return self.base / "rabbitmq.conf"

    @property
    def stdout_file(self) -> Path:
        """Where the node's stdout and stderr go (boot failures land here, not in the log)."""
        return self.base / "stdout.log"

    @property
    def pid_file(self) -> Path:
        """The pid file RabbitMQ writes during boot."""
        return self.base / "pid"

    def log_file(self, nodename: str) -> Path:
        """The node's main log file."""
        return self.log_base / f"{nodename}.log"

    def prepare(self, port: int, config: Mapping[str, str]) -> None:
        """Creates the directories, config files and Erlang cookie; keeps an existing cookie and data."""
        for directory in (self.base, self.mnesia_base, self.log_base):
            directory.mkdir(parents=True, exist_ok=True)
        settings = {"listeners.tcp.1": f"127.0.0.1:{port}", **DEFAULT_CONFIG, **config}
        self.config_file.write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
        (self.base / "enabled_plugins").write_text("[].\n")
        (self.base / "rabbitmq-env.conf").write_text("# empty: keeps /etc/rabbitmq/rabbitmq-env.conf out\n")
        cookie = self.base / ".erlang.cookie"
        if not cookie.exists():
            # Created before the node starts, mode 0400: Erlang refuses a cookie others can read, and
            # a node started without one would race rabbitmqctl to create it.
            value = "".join(secrets.choice(_COOKIE_ALPHABET) for _ in range(32))
            fd = os.open(cookie, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "w") as handle:
                handle.write(value)

    def env(self, nodename: str, port: int, dist_port: int, extra_erl_args: str = "") -> dict[str, str]:
        """The environment for ``rabbitmq-server`` and ``rabbitmqctl`` of this node (same HOME, cookie)."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("RABBITMQ_") and key not in _DROPPED_ENV
        }
        env.update(
            HOME=str(self.base),
            RABBITMQ_NODENAME=nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(port),
            RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_MNESIA_BASE=str(self.mnesia_base),
            RABBITMQ_LOG_BASE=str(self.log_base),
            RABBITMQ_CONFIG_FILE=str(self.config_file),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.base / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(self.base / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.pid_file),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=f"{_LOOPBACK_DIST} {NO_BUSY_WAIT} {extra_erl_args}".strip(),
        )
        return env

    def log_tail(self, nodename: str, lines: int = 40) -> str:
        """The first error lines (usually the cause) and the last lines of the node's stdout and log."""
        parts = []
        for path in (self.stdout_file, self.log_file(nodename)):
            try:
                text = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            errors = [line for line in text[:-lines] if "[error]" in line][:_ERROR_LINES]
            if errors:
                parts.append(f"--- {path}: first errors ---\n" + "\n".join(errors))
            parts.append(f"--- {path}: last lines ---\n" + "\n".join(text[-lines:]))
        return "\n".join(parts) or "(no log output)"
