"""What `truba up` keeps in its --state: the layout for the next run, and who owns the state now."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from truba.local.up_state import SavedCluster, SavedNode, StateInUse, owning, started_at


def test_the_layout_round_trips_and_a_missing_one_is_empty(tmp_path: Path) -> None:
    assert SavedCluster.load(tmp_path) == SavedCluster()
    saved = SavedCluster([SavedNode("truba-1@localhost", 12000, 12001)], "127.0.0.1:13000", [(1, 2)])
    saved.save(tmp_path)
    assert SavedCluster.load(tmp_path) == saved


def test_a_layout_with_unreadable_pids_keeps_its_nodes(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(
        '{"nodes": [{"name": "n@localhost", "port": 1, "dist_port": 2}], "scheduler": "h:3", "pids": [7]}'
    )
    saved = SavedCluster.load(tmp_path)
    assert (saved.nodes, saved.scheduler, saved.pids) == ([SavedNode("n@localhost", 1, 2)], "h:3", [])


def test_a_second_truba_up_on_a_state_in_use_is_told_which_pid_holds_it(tmp_path: Path) -> None:
    # `scripts/demo` while a cluster was up said only "scheduler exited with 1; see …/scheduler.log"
    with owning(tmp_path), pytest.raises(StateInUse) as refused, owning(tmp_path):
        pass
    assert f"a cluster is already up on {tmp_path} (truba up, pid {os.getpid()})" in str(refused.value)
    assert f"kill {os.getpid()}" in str(refused.value)
    with owning(tmp_path):  # free again
        pass


def test_processes_an_earlier_run_left_running_are_named(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        SavedCluster(pids=[(child.pid, started_at(child.pid)), (child.pid, 1)]).save(tmp_path)
        with pytest.raises(StateInUse, match=f"still run \\(pids {child.pid}\\)"), owning(tmp_path):
            pass
    finally:
        child.kill()
        child.wait()
    assert started_at(child.pid) == -1
    with owning(tmp_path):
        pass
