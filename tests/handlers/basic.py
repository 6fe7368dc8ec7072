"""Small handlers for tests: echo, fail on demand, sleep, crash the slot."""

from __future__ import annotations

import os
import time


def echo(payload: object) -> object:
    return payload


def square(payload: int) -> int:
    if payload == -1:
        raise ValueError("negative one is not welcome here")
    return payload * payload


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def crash(payload: object) -> object:
    os._exit(13)


def unserializable(payload: object) -> object:
    return object()


def noisy(payload: object) -> object:
    print("this goes to stderr, not into the frames")
    return payload


def behave(payload: list[object]) -> object:
    """``["ok", v]`` returns v, ``["raise", message]`` raises ValueError, ``["sleep", s]`` sleeps,
    ``["exit", code]`` ends the slot process at once."""
    what, arg = payload
    if what == "raise":
        raise ValueError(str(arg))
    if what == "sleep":
        time.sleep(float(arg))  # type: ignore[arg-type]
    if what == "exit":
        os._exit(int(arg))  # type: ignore[call-overload]
    return arg
