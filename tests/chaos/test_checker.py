"""The chaos checker on hand-made runs: it must find what it is there to find."""

from __future__ import annotations

import json
from pathlib import Path

from tests.chaos.checker import check
from tests.handlers.chaos import expected


def _run(
    tmp_path: Path, sizes: dict[str, int], *incarnations: tuple[int, list[tuple[str, int, str, float]]]
) -> Path:
    (tmp_path / "client").mkdir()
    (tmp_path / "executions").mkdir()
    (tmp_path / "jobs.json").write_text(json.dumps([{"tag": t, "tasks": n} for t, n in sizes.items()]))
    for pid, records in incarnations:
        with open(tmp_path / "client" / f"outcomes.{pid}", "w") as out:
            for tag, i, task_id, t in records:
                value = expected(tag, i) if i >= 0 else None
                ok = i >= 0
                out.write(
                    json.dumps({"tag": tag, "task_id": task_id, "ok": ok, "value": value, "t": t}) + "\n"
                )
            out.write('{"tag": "a", "task_id": "torn')  # a killed incarnation's last line
    return tmp_path


def test_a_clean_run_passes_and_executions_are_counted(tmp_path: Path) -> None:
    run = _run(tmp_path, {"a": 3}, (1, [("a", 0, "x0", 1.0), ("a", 1, "x1", 2.0), ("a", 2, "x2", 3.0)]))
    (run / "executions" / "11").write_text("S a 0\nE a 0\nS a 1\nE a 1\nS a 2\n")
    (run / "executions" / "12").write_text("S a 2\nE a 2\nS a 1\nE a 1\n")
    verdict = check(run, [])
    assert verdict.ok and verdict.outcomes == 3
    assert (verdict.executions, verdict.duplicate_executions, verdict.interrupted_executions) == (4, 1, 1)


def test_lost_duplicated_and_unexpected_outcomes_are_found(tmp_path: Path) -> None:
    first = [("a", 0, "x0", 1.0), ("a", 1, "x1", 2.0), ("a", -1, "x3", 2.5)]
    again = [("a", 0, "x0", 10.0), ("b", 0, "y0", 11.0), ("a", 7, "x7", 12.0)]
    verdict = check(_run(tmp_path, {"a": 3}, (1, first), (2, again)), [])
    assert verdict.lost == ["a:2"]
    assert len(verdict.duplicates) == 1 and verdict.duplicates[0].startswith("a:0")
    assert len(verdict.unexpected) == 3  # not ok, an unknown job, a task out of range
    assert not verdict.ok


def test_only_the_outcomes_taken_just_before_a_client_kill_may_come_again(tmp_path: Path) -> None:
    killed = [("a", 0, "x0", 100.0), ("a", 1, "x1", 109.5)]
    resumed = [("a", 0, "x0", 120.0), ("a", 1, "x1", 121.0), ("a", 2, "x2", 122.0)]
    verdict = check(_run(tmp_path, {"a": 3}, (1, killed), (2, resumed)), [(1, 110.0)])
    assert verdict.redelivered_after_client_kill == 1  # x1, taken 0.5 s before the kill
    assert [d.split()[0] for d in verdict.duplicates] == ["a:0"]  # x0 was taken 10 s before
