"""A blocking client process for the SDK robustness tests, configuring no logging (as a user's
script): what it prints to stderr is what a user would see.

Usage: ``interrupt_client_proc.py MODE ADDRESS JOURNAL_DIR``

- ``map``: a blocking ``job.map`` over slow tasks; prints ``job <id>``, then ``outcome`` per
  outcome, flushed. The test sends SIGINT mid-map.
- ``outage``: submits 20 slow tasks with ``unavailable_after=3``, prints ``job <id>`` and
  ``outcome`` per outcome; the test stops every broker; prints ``unavailable <seconds>`` when
  ``results()`` gives up (seconds since the first outcome).
"""

from __future__ import annotations

import sys
import time

import truba
from truba.client import Unavailable


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def mapping(address: str, journal: str) -> None:
    with truba.connect(address, journal=journal) as client:
        job = client.create_job("tests.handlers.basic:sleep", name="interrupted-map")
        say(f"job {job.id}")
        for _ in job.map([0.2] * 400, progress=False):
            say("outcome")


def outage(address: str, journal: str) -> None:
    with truba.connect(address, journal=journal, unavailable_after=3.0) as client:
        job = client.create_job("tests.handlers.basic:sleep", name="outage")
        say(f"job {job.id}")
        for _ in range(20):
            job.submit(0.5)
        job.close()
        first = None
        try:
            for _ in job.results():
                first = first or time.monotonic()
                say("outcome")
        except Unavailable:
            say(f"unavailable {time.monotonic() - (first or time.monotonic()):.1f}")


if __name__ == "__main__":
    {"map": mapping, "outage": outage}[sys.argv[1]](sys.argv[2], sys.argv[3])
