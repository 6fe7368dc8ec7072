"""create_job's arguments: strict option names, limits checked before any call, and handlers
given as functions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.handlers import basic
from tests.unit.client.fakes import FakeScheduler, client_for
from truba.client import Client, InvalidArgument
from truba.client.handler_name import handler_name
from truba.pipes.fake_broker import FakeBroker


@pytest.fixture
def scheduler() -> FakeScheduler:
    return FakeScheduler([FakeBroker("fake://b0")])


@pytest.fixture
async def client(scheduler: FakeScheduler) -> AsyncIterator[Client]:
    async with client_for(scheduler) as client:
        yield client


async def test_create_job_with_task_timout_raises_type_error_and_creates_nothing(
    scheduler: FakeScheduler, client: Client
) -> None:
    with pytest.raises(TypeError, match=r"unknown option 'task_timout'; did you mean 'task_timeout'\?"):
        await client.create_job("m:f", task_timout=1, max_attempt=1)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"unknown option 'importanse'; did you mean 'importance'\?"):
        await client.create_job("m:f", importanse=2)  # type: ignore[call-overload]
    assert scheduler.calls == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"importance": None}, "importance: must be a finite number > 0, got None"),
        ({"importance": "high"}, "importance: must be a finite number > 0, got 'high'"),
        ({"max_attempts": 0}, "max_attempts: must be at least 1, got 0"),
        ({"max_slots": 0}, "max_slots: must be at least 1, got 0"),
        ({"min_slots": 3, "max_slots": 2}, "max_slots: must be at least min_slots=3, got 2"),
    ],
)
async def test_bad_limits_are_invalid_arguments_before_any_call(
    scheduler: FakeScheduler, client: Client, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        await client.create_job("m:f", **arguments)
    assert scheduler.calls == []


async def test_a_module_level_function_is_the_handler_module_colon_qualname(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job(basic.square)
    assert job.handler == "tests.handlers.basic:square"
    await job.cancel()


def test_a_lambda_is_refused_saying_to_define_it_with_def() -> None:
    with pytest.raises(InvalidArgument, match="a lambda has no name a daemon can import"):
        handler_name(lambda payload: payload)


def test_a_nested_function_is_refused_saying_to_move_it_to_module_level() -> None:
    def inner(payload: object) -> object:
        return payload

    with pytest.raises(InvalidArgument, match="defined inside a function.*move it to the top level"):
        handler_name(inner)


def test_a_function_of_main_is_refused_saying_a_daemon_cannot_import_it() -> None:
    def script_function(payload: object) -> object:
        return payload

    script_function.__module__ = "__main__"
    script_function.__qualname__ = "script_function"
    with pytest.raises(InvalidArgument, match="defined in __main__.*move it into a module"):
        handler_name(script_function)


def test_a_string_handler_is_taken_as_it_is() -> None:
    assert handler_name("examples.primes:count") == "examples.primes:count"


async def test_set_importance_high_is_an_invalid_argument_not_a_protobuf_type_error(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("m:f")
    with pytest.raises(InvalidArgument, match="importance: must be a finite number > 0, got 'high'"):
        await job.set_importance("high")  # type: ignore[arg-type]
    assert "SetImportance" not in scheduler.calls
    await job.cancel()
