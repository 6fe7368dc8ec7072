"""bench/jain_bound.py: the best Jain's index with some jobs draining, against a brute force."""

from __future__ import annotations

import importlib.util
import itertools
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "jain_bound.py"
_SPEC = importlib.util.spec_from_file_location("jain_bound", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)
best_jain = cast(Callable[[Sequence[float], Sequence[tuple[float, float]], float], float], _MODULE.best_jain)
jain = cast(Callable[[Sequence[float]], float], _MODULE.jain)


def brute(fixed: list[float], free: list[tuple[float, float]], room: float, step: float = 1.0) -> float:
    """Every split of up to ``room`` slots, in steps of ``step``, over the free jobs (within their caps)."""
    best = 0.0
    ranges = [[i * step for i in range(int(most / step + 1e-9) + 1)] for _, most in free]
    for slots in itertools.product(*ranges):
        if sum(slots) <= room + 1e-9:
            best = max(best, jain(fixed + [n / x for n, (x, _) in zip(slots, free, strict=True)]))
    return best


def test_jain_of_equal_ratios_is_one_and_of_one_job_alone_served_is_one_over_n() -> None:
    assert jain([0.5, 0.5, 0.5]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_without_draining_jobs_an_equal_split_reaches_one() -> None:
    assert best_jain([], [(4.0, 10.0), (2.0, 10.0), (1.0, 10.0)], 7.0) == pytest.approx(1.0)


def test_a_draining_job_above_its_share_caps_the_index_below_one() -> None:
    # One job runs 2x its share and nothing else may give: the others at best share the rest.
    value = best_jain([2.0], [(4.0, 4.0), (4.0, 4.0)], 4.0)
    assert value == pytest.approx(jain([2.0, 0.5, 0.5]), abs=1e-6)
    assert value < 0.9


def test_the_bound_is_at_least_every_whole_slot_split() -> None:
    rng = random.Random(7)
    for _ in range(60):
        fixed = [rng.uniform(1.0, 2.5) for _ in range(rng.randint(0, 2))]
        free = [(rng.uniform(0.5, 4.0), float(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))]
        room = rng.randint(0, 8)
        value = best_jain(fixed, free, float(room))
        assert value >= brute(fixed, free, room) - 1e-6  # fractional splits include the whole ones
        assert value <= 1.0 + 1e-9


def test_the_bound_is_the_best_fractional_split_within_a_fine_grid() -> None:
    rng = random.Random(11)
    for _ in range(25):
        fixed = [rng.uniform(1.0, 2.5) for _ in range(rng.randint(1, 2))]
        free = [(rng.uniform(1.0, 3.0), float(rng.randint(1, 2))) for _ in range(2)]
        room = rng.uniform(0.0, 4.0)
        fine = brute(fixed, free, room, step=0.01)
        assert fine - 1e-6 <= best_jain(fixed, free, room) <= fine + 5e-3
