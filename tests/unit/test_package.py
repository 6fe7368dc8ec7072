"""The installed layout: truba.* only, public names exported, no generic top-level modules."""

from __future__ import annotations
import __future__

import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "module",
    [
        "truba",
        "truba.pipes",
        "truba.scheduler",
        "truba.daemon",
        "truba.client",
        "truba.proto",
        "truba.local",
        "truba.timeplot",
    ],
)
def test_every_public_name_in_all_exists(module: str) -> None:
    mod = importlib.import_module(module)
    for name in getattr(mod, "__all__", []):
        assert getattr(mod, name) is not None, f"{module}.{name}"


PACKAGES = [
    "truba",
    "truba.pipes",
    "truba.pipes.rabbit",
    "truba.scheduler",
    "truba.daemon",
    "truba.client",
    "truba.proto",
    "truba.local",
    "truba.timeplot",
]


def public_names(module: types.ModuleType) -> set[str]:
    """What a module offers: its names that are not private, not submodules and not the
    ``from __future__ import annotations`` feature (for ``truba`` itself: its lazy exports too)."""
    names = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)
        and name != "TYPE_CHECKING"
    }
    return names | set(getattr(module, "_EXPORTS", {}))


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_exactly_the_public_names(name: str) -> None:
    module = importlib.import_module(name)
    declared = getattr(module, "__all__", None)
    assert declared is not None, f"{name} has no __all__"
    assert len(declared) == len(set(declared)), f"{name}.__all__ repeats a name"
    assert set(declared) == public_names(module)


def test_a_forgotten_export_is_caught() -> None:
    module = types.ModuleType("sneaky")
    exec("from __future__ import annotations\nimport json\nx = 1\n__all__ = []", vars(module))
    assert public_names(module) == {"x"}


def test_truba_exports_the_sdk() -> None:
    import truba

    assert truba.Client is importlib.import_module("truba.client").Client
    assert callable(truba.connect)


def test_no_generic_top_level_modules_are_installed(tmp_path: Path) -> None:
    # Run from an empty directory so that the checkout itself is not on sys.path.
    probe = (
        "import importlib.util as u, json;"
        "names = ['pipes', 'client', 'scheduler', 'daemon', 'proto', 'core', 'src', 'examples'];"
        "print(json.dumps({n: str(getattr(u.find_spec(n), 'origin', None)) for n in names}))"
    )
    argv = [sys.executable, "-c", probe]
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=True)
    origins = json.loads(out.stdout)
    ours = {name: origin for name, origin in origins.items() if origin.startswith(str(REPO))}
    assert ours == {}, ours


def test_the_console_script_runs() -> None:
    argv = [sys.executable, "-m", "truba", "--help"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    for command in ("scheduler", "daemon", "up", "jobs"):
        assert command in out.stdout
