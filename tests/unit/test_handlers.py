"""The ``@truba.handlers.batch`` mark."""

from __future__ import annotations

import subprocess
import sys

import pytest

import truba
import truba.handlers
from truba.handlers import BatchSpec, batch_spec


def test_batch_marks_the_function_and_leaves_it_callable() -> None:
    @truba.handlers.batch(max_size=8, max_wait=0.01)
    def double(payloads: list[int]) -> list[int]:
        return [2 * p for p in payloads]

    assert batch_spec(double) == BatchSpec(8, 0.01)
    assert double([1, 2]) == [2, 4]
    assert batch_spec(len) is None and batch_spec(lambda p: p) is None
    assert truba.batch is truba.handlers.batch


@pytest.mark.parametrize(
    ("max_size", "max_wait"), [(0, 0.1), (True, 0.1), (2.5, 0.1), (4, -1.0), (4, float("inf"))]
)
def test_batch_refuses_nonsense_limits(max_size: int, max_wait: float) -> None:
    with pytest.raises(ValueError):
        truba.handlers.batch(max_size=max_size, max_wait=max_wait)


def test_importing_the_mark_stays_cheap() -> None:
    code = "import sys, truba.handlers; print(any(m in sys.modules for m in ('grpc', 'aio_pika', 'aiormq')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
