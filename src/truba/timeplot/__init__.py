"""Timelines of task attempts (seed 002's timeplotters): a lane per daemon and slot over time.

:mod:`~truba.timeplot.model` turns the scheduler's ``Timeline`` messages into :class:`Span`s;
:func:`write_html` draws them as one self-contained interactive page (the dashboard's own
``timeline.js`` inlined, nothing fetched from elsewhere); :func:`write_png` as a picture with
matplotlib. ``truba timeline`` (:mod:`truba.cli.timeline`) is the command that uses them.
"""

from __future__ import annotations

from truba.timeplot.html import write_html
from truba.timeplot.model import OUTCOMES, Span, spans_of
from truba.timeplot.png import write_png

__all__ = ["OUTCOMES", "Span", "spans_of", "write_html", "write_png"]
