"""A job created from a typed function is typed by it (Job[P, R], Outcome[R]): mypy checks a
snippet that uses one."""

from __future__ import annotations

from pathlib import Path

from mypy import api

SNIPPET = """
import truba


def square(payload: int) -> int:
    return payload * payload


async def use(client: truba.Client) -> None:
    job = await client.create_job(square, importance=2.0)
    await job.submit(3)
    async for outcome in job.results():
        reveal_type(outcome.result())
    await job.submit("three")
    named = await client.create_job("mod:f")
    async for other in named.results():
        reveal_type(other.result())


def blocking(client: truba.BlockingClient) -> None:
    for outcome in client.create_job(square).map([1, 2]):
        total: str = outcome.result()
"""


def test_outcome_result_is_typed_by_the_handler_and_a_wrong_payload_is_a_type_error(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    report, _, _ = api.run(["--strict", "--no-incremental", "--follow-imports=silent", str(snippet)])
    lines = [line.split(": ", 1)[1] for line in report.splitlines() if line.startswith(str(snippet))]
    assert 'note: Revealed type is "int"' in lines
    assert 'note: Revealed type is "Any"' in lines  # a handler given by name: untyped
    assert any("submit" in line and '"str"' in line and "arg-type" in line for line in lines), report
    assert any('"int", variable has type "str"' in line for line in lines), report
