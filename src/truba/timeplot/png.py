"""A timeline as a PNG with matplotlib: lanes per daemon and slot, marks, legend.

Readable with thousands of spans: bars are drawn per lane and colour as one collection each
(``broken_barh``), marks as one scatter per kind, and the figure grows with the lanes (up to a
limit, then lanes get thinner).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from truba.timeplot.model import OUTCOMES, Span, lanes_of

JOB_COLORS: Final = ["#2f6fdf", "#2e9d5b", "#d0443c", "#c98a12", "#8a4fd0", "#1a9aa0", "#d05f9a", "#6b7585"]
_MARKS: Final = {
    "error": ("x", "#d0443c"),
    "timeout": ("x", "#8a4fd0"),
    "crashed": ("x", "#7a3b12"),
    "retried": ("o", "#e59a1c"),
    "preempted": ("v", "#2f6fdf"),
    "gave_up": ("X", "#111111"),
    "slot_taken": ("|", "#6b7585"),
}
"""Marker and colour of each marked outcome (at the attempt's end)."""


def write_png(path: Path, spans: Sequence[Span], title: str) -> None:
    """Draws ``spans`` into ``path`` (bars coloured by outcome, or by job when several)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    lanes = lanes_of(list(spans))
    row = {lane: i for i, lane in enumerate(lanes)}
    jobs = sorted({s.job_id for s in spans})
    by_job = len(jobs) > 1
    height = min(40.0, max(3.2, 1.6 + 0.28 * len(lanes)))  # the legend needs about 3 inches
    fig, ax = plt.subplots(figsize=(14, height), dpi=110)
    bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    marks: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    # x: seconds since the minute the first span started in (round ticks are round clock times)
    base = min((s.start for s in spans), default=0.0) // 60 * 60
    for span in spans:
        y = row[span.lane]
        if span.outcome != "slot_taken":
            color = (
                JOB_COLORS[jobs.index(span.job_id) % len(JOB_COLORS)] if by_job else OUTCOMES[span.outcome][0]
            )
            bars[(y, color)].append((span.start - base, max(span.end - span.start, 1e-4)))
        if span.outcome in _MARKS:
            xs, ys = marks[span.outcome]
            xs.append(span.end - base)
            ys.append(y)
    for (y, color), ranges in bars.items():
        ax.broken_barh(ranges, (y - 0.4, 0.8), facecolors=color, linewidth=0)
    for outcome, (xs, ys) in marks.items():
        marker, color = _MARKS[outcome]
        ax.scatter(xs, ys, marker=marker, c=color, s=28 if marker != "|" else 160, zorder=3, linewidths=1.2)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8 if len(lanes) < 40 else 5)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    first = min((s.start for s in spans), default=0.0)
    last = max((s.end for s in spans), default=0.0)
    clock = "%H:%M:%S.%f" if last - first < 20 else "%H:%M:%S"
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _clock(base + x, clock)))
    ax.set_axisbelow(True)  # grid lines under the bars
    ax.set_xlabel(f"time (UTC), {datetime.fromtimestamp(first, UTC):%Y-%m-%d}")
    ax.grid(axis="x", color="#e3e7ee")
    ax.set_title(title, fontsize=11, loc="left")
    handles: list[Patch | Line2D] = []
    if by_job:
        handles += [
            Patch(color=JOB_COLORS[i % len(JOB_COLORS)], label=f"job {j}") for i, j in enumerate(jobs)
        ]
    else:
        handles += [
            Patch(color=c, label=label) for key, (c, label) in OUTCOMES.items() if key != "slot_taken"
        ]
    handles += [
        Line2D([], [], marker=m, color=c, linestyle="", label=OUTCOMES[k][1] + " (mark)")
        for k, (m, c) in _MARKS.items()
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _clock(seconds: float, pattern: str) -> str:
    """A tick's label: UTC time of day (milliseconds when ``pattern`` has ``%f``)."""
    text = datetime.fromtimestamp(seconds, UTC).strftime(pattern)
    return text[:-3] if pattern.endswith("%f") else text
