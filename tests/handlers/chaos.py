"""The chaos run's handler: records every execution in a file per slot process, then works.

``work([folder, tag, i, seconds])`` appends ``S tag i`` to ``folder/<pid>`` when it starts and
``E tag i`` when it ends, sleeps ``seconds`` in between, and returns ``[tag, i, i * i]``. The
checker reads the files to count executions: a task with two ``E`` lines ran twice to the end.
"""

from __future__ import annotations

import os
import time


def expected(tag: str, i: int) -> list[object]:
    """The value ``work`` returns for task ``i`` of the job tagged ``tag``."""
    return [tag, i, i * i]


def _note(folder: str, line: str) -> None:
    with open(os.path.join(folder, str(os.getpid())), "a") as file:
        file.write(line + "\n")


def work(payload: list[object]) -> list[object]:
    folder, tag, i, seconds = str(payload[0]), str(payload[1]), int(payload[2]), float(payload[3])  # type: ignore[call-overload,arg-type]
    _note(folder, f"S {tag} {i}")
    time.sleep(seconds)
    _note(folder, f"E {tag} {i}")
    return expected(tag, i)
