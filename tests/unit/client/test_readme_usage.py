"""The README's "Using it" section matches the SDK: its snippet uses no undefined name, and every
outcome field it names exists where it says."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import re
from pathlib import Path

from truba.client import Outcome
from truba.wire import ErrorInfo

README = Path(__file__).resolve().parents[3] / "README.md"


def using_it() -> str:
    text = README.read_text()
    section = text[text.index("## Using it") :]
    return section[: section.index("\n## ", 1)]


def test_the_usage_snippets_define_every_name_they_use() -> None:
    snippets = re.findall(r"```python\n(.*?)```", using_it(), re.S)
    assert snippets
    for code in snippets:
        # Async code runs inside a coroutine: wrap each snippet so that `await` parses.
        tree = ast.parse("async def _snippet():\n" + "\n".join("    " + line for line in code.splitlines()))
        stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        stored |= {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names
        }
        stored |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        stored |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
        loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert loaded - stored - set(dir(builtins)) - {"truba"} == set(), code


def test_the_outcome_fields_the_readme_names_exist_where_it_says() -> None:
    outcome = {f.name for f in dataclasses.fields(Outcome)} | {"result"}
    error = {f.name for f in dataclasses.fields(ErrorInfo)}
    named = re.findall(r"outcome\.(\w+)(?:\.(\w+))?", README.read_text())
    assert named
    for field, inner in named:
        assert field in outcome, f"outcome.{field}"
        if field == "error" and inner:
            assert inner in error, f"outcome.error.{inner}"
    listed = re.search(r"`outcome\.error`: its (.*?)\)", using_it(), re.S)
    assert listed is not None
    assert set(re.findall(r"`(\w+)`", listed.group(1))) <= error  # attempts is on Outcome, not the error
