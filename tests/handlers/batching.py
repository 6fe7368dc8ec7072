"""Batch handlers for tests: each result says how large its batch was."""

from __future__ import annotations

import os

import truba.handlers


@truba.handlers.batch(max_size=16, max_wait=0.05)
def double_all(payloads: list[int]) -> list[list[int]]:
    """Each payload doubled, next to the size of the batch it came in."""
    return [[2 * p, len(payloads)] for p in payloads]


@truba.handlers.batch(max_size=8, max_wait=0.05)
def fail_all(payloads: list[object]) -> list[object]:
    raise RuntimeError(f"a batch of {len(payloads)} is too much")


@truba.handlers.batch(max_size=8, max_wait=0.05)
def one_short(payloads: list[object]) -> list[object]:
    return payloads[1:]


@truba.handlers.batch(max_size=4, max_wait=0.05)
def some_unsendable(payloads: list[object]) -> list[object]:
    return [object() if p == "bad" else p for p in payloads]


@truba.handlers.batch(max_size=4, max_wait=0.2)
def sleep_all(payloads: list[float]) -> list[float]:
    import time

    time.sleep(max(payloads))
    return payloads


@truba.handlers.batch(max_size=4, max_wait=0.0)
def crash_all(payloads: list[object]) -> list[object]:
    os._exit(13)
