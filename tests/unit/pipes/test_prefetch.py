"""The prefetch window: its size, and its split over several brokers' leaves."""

from __future__ import annotations

from truba.pipes.prefetch import Window


async def test_a_split_window_spreads_its_total_over_the_leaves() -> None:
    window = Window(5, leaves=2)
    applied: list[int] = []

    async def apply(size: int) -> None:
        applied.append(size)

    window.watch(apply)
    assert window.leaf_size == 5
    await window.set_split(True)
    assert window.leaf_size == 3 and applied == [3]  # ceil(5 / 2): never below one per leaf
    await window.set_split(True)  # no change, nothing applied
    await window.resize(2)
    assert applied == [3, 1]
    await window.set_split(False)
    assert applied == [3, 1, 2]


async def test_a_single_leaf_window_never_splits() -> None:
    window = Window(4)
    await window.set_split(True)
    assert window.leaf_size == 4 and not window.split
