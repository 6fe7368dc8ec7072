"""Slot sizing from the machine, slot memory readings, job settings."""

from __future__ import annotations

import os
from pathlib import Path

from truba.daemon.memory import parse_private_kib, private_bytes
from truba.daemon.settings import DEFAULT_MAX_ATTEMPTS, JobSettings
from truba.daemon.sizing import available_memory, default_slots, usable_cpus
from truba.proto.v1 import common_pb2

GIB = 1024**3


def _machine(tmp_path: Path, available_kib: int, files: dict[str, str]) -> Path:
    (tmp_path / "proc").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kib} kB\n")
    for name, text in files.items():
        path = tmp_path / "sys" / "fs" / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_slots_follow_cpus_and_available_memory(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    roomy = _machine(tmp_path / "a", 64 * 1024 * 1024, {})
    assert default_slots(root=roomy) == cpus
    tight = _machine(tmp_path / "b", 1024 * 1024, {})  # 1 GiB for 512 MiB slots
    assert default_slots(root=tight) == min(cpus, 2)
    assert default_slots(per_slot=2 * GIB, root=tight) == 1  # never fewer than one


def test_cgroup_v2_limits_lower_cpus_and_memory(tmp_path: Path) -> None:
    root = _machine(
        tmp_path,
        64 * 1024 * 1024,
        {"cpu.max": "50000 100000", "memory.max": str(3 * GIB), "memory.current": str(GIB)},
    )
    assert usable_cpus(root) == 1  # half a CPU rounds up to one
    assert available_memory(root) == 2 * GIB
    assert default_slots(per_slot=GIB // 2, root=root) == 1


def test_cgroup_v1_limits_and_unlimited_markers(tmp_path: Path) -> None:
    root = _machine(
        tmp_path,
        64 * 1024 * 1024,
        {
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
            "memory/memory.limit_in_bytes": str(1 << 62),
            "memory/memory.usage_in_bytes": "0",
        },
    )
    assert usable_cpus(root) == len(os.sched_getaffinity(0))
    assert available_memory(root) == 64 * GIB


def test_private_memory_of_a_process() -> None:
    text = "Rss: 100 kB\nPss: 50 kB\nPrivate_Clean: 40 kB\nPrivate_Dirty: 112 kB\n"
    text += "Swap: 8 kB\nShared_Clean: 9 kB\n"
    assert parse_private_kib(text) == 160
    own = private_bytes(os.getpid())
    assert own is not None and own > 1024 * 1024
    assert private_bytes(2**22 + 12345) is None  # no such process


def test_job_settings_from_the_assignment_with_defaults_for_zero() -> None:
    assert JobSettings.from_proto(common_pb2.JobSettings()) == JobSettings(False, None, DEFAULT_MAX_ATTEMPTS)
    given = common_pb2.JobSettings(
        preemption=common_pb2.PREEMPTION_IMMEDIATE, task_timeout=2.5, max_attempts=7
    )
    settings = JobSettings.from_proto(given)
    assert settings == JobSettings(True, 2.5, 7)
    assert JobSettings.from_proto(settings.to_proto()) == settings
    graceful = common_pb2.JobSettings(preemption=common_pb2.PREEMPTION_GRACEFUL)
    assert not JobSettings.from_proto(graceful).immediate


def test_job_settings_carry_frames_both_ways() -> None:
    assert JobSettings.from_proto(common_pb2.JobSettings()).frames is True
    off = JobSettings.from_proto(common_pb2.JobSettings(no_frames=True))
    assert off.frames is False
    assert off.to_proto().no_frames is True
    assert JobSettings().to_proto().no_frames is False
    assert JobSettings.from_proto(off.to_proto()) == off
