from __future__ import annotations

import pytest

from truba.daemon.allow import is_allowed, is_valid_handler


@pytest.mark.parametrize("handler", ["examples.primes:count", "a:b", "pkg.sub_mod.x9:f_1"])
def test_valid_handlers(handler: str) -> None:
    assert is_valid_handler(handler)


@pytest.mark.parametrize(
    "handler", ["", "nomodule", "a.b", "a:b:c", "a.:b", "1a:b", "a:b()", "os:system; rm"]
)
def test_invalid_handlers(handler: str) -> None:
    assert not is_valid_handler(handler)


def test_patterns_match_the_whole_handler_string() -> None:
    assert is_allowed("examples.primes:count", ["examples.*"])
    assert is_allowed("examples.primes:count", ["other.*", "examples.primes:count"])
    assert not is_allowed("os:system", ["examples.*"])
    assert not is_allowed("examples_evil.x:f", ["examples.*"])
    assert not is_allowed("examples.primes:count", [])
