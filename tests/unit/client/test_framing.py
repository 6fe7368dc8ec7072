"""Task frames are sized by how long the job's tasks take (late binding for long tasks)."""

from __future__ import annotations

from truba.client.framing import FIRST_FRAME, FRAME_WORK, FrameSizer
from truba.pipes.frame import FrameLimits


def test_frames_start_small_grow_for_short_tasks_and_shrink_at_once_for_a_long_one() -> None:
    limits = FrameLimits()
    sizer = FrameSizer(limits, most=64)
    assert limits.max_messages == FIRST_FRAME and sizer.task_seconds is None
    sizer.observe(0.0001)  # 100 µs tasks: a full frame is 6.4 ms of work, capped at 64 (most=64)
    assert limits.max_messages == min(64, int(FRAME_WORK / 0.0001))
    sizer.observe(1.0)  # one long task: one task per frame from now on
    assert limits.max_messages == 1
    sizer.observe(0.0001)
    assert limits.max_messages < 10  # fast ones again: frames grow back, slowly
    for _ in range(200):
        sizer.observe(0.0001)
    assert limits.max_messages >= 0.95 * int(FRAME_WORK / 0.0001)


def test_tasks_of_a_millisecond_share_a_frame_only_a_few_at_a_time() -> None:
    limits = FrameLimits()
    FrameSizer(limits).observe(0.001)
    assert limits.max_messages == int(FRAME_WORK / 0.001)


def test_instant_tasks_get_the_largest_frames() -> None:
    limits = FrameLimits()
    FrameSizer(limits, most=32).observe(0.0)
    assert limits.max_messages == 32
