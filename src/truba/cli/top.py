"""``truba top``: a live view of the scheduler's jobs and daemons, refreshed every ``--interval``.

On a terminal it draws full screen with :mod:`curses` and quits on ``q`` or Ctrl-C (exit 0),
leaving the terminal as it was; a scheduler that stops answering shows as a line at the bottom
while ``top`` keeps asking. When stdout is not a terminal (a pipe, a file, a test) or is one
curses does not know (``$TERM``), or with ``--json``, it prints one frame per interval instead
(text frames apart by a blank line, or a JSON object a line) and a failed call ends it with one
line and its exit status, like the other verbs. ``--count N`` stops after N frames. The first
sample is taken before anything is drawn: a scheduler that cannot be reached is one line on
stderr and exit 69, as for every verb.
"""

from __future__ import annotations

import argparse
import collections
import curses
import json
import sys
import time
from typing import Final

from truba.cli.exits import OK, USAGE, CliError
from truba.cli.session import Session, add_client_arguments, session
from truba.cli.top_frame import Sample, frame_dict, frame_lines, throughput
from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc, jobs_pb2, jobs_pb2_grpc

DEFAULT_INTERVAL: Final = 1.0
"""Seconds between two samples."""
WINDOW: Final = 5
"""Samples the throughput is measured over (the newest against the oldest of them)."""
QUIT_KEYS: Final = frozenset({ord("q"), ord("Q")})


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``top``."""
    parser = sub.add_parser(
        "top",
        help="a live view of jobs and daemons",
        description="A live view of the scheduler's jobs (importance, fair share against the slots held, "
        "backlog, running, done, failed, tasks a second) and the cluster's daemons, slots and busy slots, "
        "refreshed every --interval. q or Ctrl-C quits. When stdout is not a terminal, or with --json, "
        "it prints a frame per interval instead.",
    )
    add_client_arguments(parser)
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between two refreshes (default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument(
        "--count", type=int, default=0, metavar="N", help="stop after N frames (default 0: until q or Ctrl-C)"
    )
    parser.set_defaults(func=top)


class Sampler:
    """Takes :class:`Sample` s through one session and keeps the last :data:`WINDOW` of them."""

    def __init__(self, s: Session) -> None:
        self._s = s
        self._jobs = jobs_pb2_grpc.JobServiceStub(s.channel)
        self._daemons = daemons_pb2_grpc.DaemonServiceStub(s.channel)
        self.samples: collections.deque[Sample] = collections.deque(maxlen=WINDOW)

    def take(self) -> None:
        """Asks the scheduler for its jobs and daemons.

        Raises:
            CliError: a call failed (as one line); the samples are unchanged.
        """
        jobs = self._s.call(self._jobs.ListJobs, jobs_pb2.ListJobsRequest()).jobs
        daemons = self._s.call(self._daemons.ListDaemons, daemons_pb2.ListDaemonsRequest()).daemons
        self.samples.append(Sample(time.monotonic(), time.time(), list(jobs), list(daemons)))

    def lines(self) -> list[str]:
        return frame_lines(self._s.address, self.samples[-1], throughput(self.samples))

    def json_line(self) -> str:
        return json.dumps(frame_dict(self._s.address, self.samples[-1], throughput(self.samples)))


def top(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.count < 0:
        raise CliError("--interval must be > 0 and --count >= 0", USAGE)
    with session(args) as s:
        sampler = Sampler(s)
        sampler.take()
        try:
            if args.json or not _can_draw():
                _print_frames(sampler, args.interval, args.count, as_json=args.json)
            else:
                curses.wrapper(_live, sampler, args.interval, args.count)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how top is left; curses.wrapper restored the terminal
    return OK


def _can_draw() -> bool:
    """stdout is a terminal that curses knows (``$TERM`` unset or unknown: frames are printed)."""
    if not sys.stdout.isatty():
        return False
    try:
        curses.setupterm(fd=sys.stdout.fileno())
    except curses.error:
        return False
    return True


def _print_frames(sampler: Sampler, interval: float, count: int, *, as_json: bool) -> None:
    shown = 0
    while True:
        if as_json:
            print(sampler.json_line(), flush=True)
        else:
            print("\n".join([*sampler.lines(), ""]), flush=True)
        shown += 1
        if shown == count:
            return
        time.sleep(interval)
        sampler.take()


def _live(screen: curses.window, sampler: Sampler, interval: float, count: int) -> None:
    """Draws a frame, waits ``interval`` for a key (``q`` quits), samples again; forever."""
    try:
        curses.curs_set(0)
    except curses.error:
        pass  # a terminal that cannot hide its cursor
    problem = ""
    shown = 0
    while True:
        _draw(screen, sampler.lines(), problem or f"q quits; every {interval:g} s")
        shown += 1
        if shown == count:
            return
        deadline = time.monotonic() + interval
        while (left := deadline - time.monotonic()) > 0:
            screen.timeout(max(1, int(left * 1000)))
            key = screen.getch()
            if key in QUIT_KEYS:
                return
            if key == curses.KEY_RESIZE:
                _draw(screen, sampler.lines(), problem or f"q quits; every {interval:g} s")
        try:
            sampler.take()
            problem = ""
        except CliError as exc:  # shown, and asked again next time: the view outlives a restart
            problem = str(exc)


def _draw(screen: curses.window, lines: list[str], status: str) -> None:
    height, width = screen.getmaxyx()
    screen.erase()
    for row, line in enumerate(lines[: max(0, height - 1)]):
        screen.addnstr(row, 0, line, max(0, width - 1), curses.A_BOLD if row == 0 else curses.A_NORMAL)
    if height > 1:
        screen.addnstr(height - 1, 0, status, max(0, width - 1), curses.A_REVERSE)
    screen.refresh()
