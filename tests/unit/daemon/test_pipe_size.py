"""A slot's pipes: widened for large payloads, within the user's pipe budget."""

from __future__ import annotations

import fcntl
import os

import pytest

from truba.daemon.daemon import Daemon, DaemonConfig
from truba.daemon.forkserver import ForkServer
from truba.daemon.launch import Spawn
from truba.daemon.pipe_size import DEFAULT_PIPE_BYTES, SLOT_PIPE_BYTES, SLOTS_SHARE, pipe_bytes_for, widen
from truba.pipes.testing import FakeBroker


def test_a_daemon_s_slot_pipes_hold_1_mib_each_up_to_8_slots_and_less_beyond_never_under_64_kib() -> None:
    assert [pipe_bytes_for(n) for n in (0, 1, 2, 8)] == [SLOT_PIPE_BYTES] * 4
    assert [pipe_bytes_for(n) for n in (9, 16, 32, 64, 128, 10_000)] == [
        512 * 1024,
        512 * 1024,
        256 * 1024,
        128 * 1024,
        DEFAULT_PIPE_BYTES,
        DEFAULT_PIPE_BYTES,
    ]
    for slots in range(1, 129):
        assert 2 * slots * pipe_bytes_for(slots) <= SLOTS_SHARE


def test_widen_sets_a_pipe_s_capacity_and_leaves_linux_s_own_size_alone() -> None:
    read_end, write_end = os.pipe()
    try:
        assert widen(write_end, 256 * 1024) == 256 * 1024
        assert fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ) == 256 * 1024  # one pipe, both ends
        assert widen(write_end, DEFAULT_PIPE_BYTES) == 256 * 1024  # never made smaller by us
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("fork_server", [True, False])
async def test_a_daemon_of_many_slots_gives_its_slots_narrower_pipes(fork_server: bool) -> None:
    config = DaemonConfig("127.0.0.1:1", 64, ["tests.handlers.*"], fork_server=fork_server)
    made = Daemon(config, brokers=lambda url: FakeBroker())
    launcher = made._launcher
    assert isinstance(launcher, ForkServer if fork_server else Spawn)
    assert launcher.pipe_bytes == 128 * 1024
    if isinstance(launcher, ForkServer):
        assert isinstance(launcher.fallback, Spawn) and launcher.fallback.pipe_bytes == 128 * 1024
