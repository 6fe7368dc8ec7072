"""The seams hold: only the RabbitMQ leaves and each app's composition root name the transport.

Read from the sources (no import), so a violation is found wherever it hides, in a function body
too. See docs/architecture.md, "Seams".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "truba": REPO / "src" / "truba",
    "truba.pipes": REPO / "pipes",
    "truba.client": REPO / "client",
    "truba.daemon": REPO / "daemon",
    "truba.scheduler": REPO / "scheduler",
}
COMPOSITION_ROOTS = {"truba.client.wiring", "truba.daemon.wiring", "truba.scheduler.wiring"}
"""The one module per app that picks the transport."""
TRANSPORT = ("truba.pipes.rabbit", "aio_pika", "aiormq", "pika")


def library_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            if not name.startswith("truba.pipes.rabbit"):
                modules[name] = path
    return modules


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def names_transport(name: str) -> bool:
    return any(name == t or name.startswith(t + ".") for t in TRANSPORT)


def test_the_library_is_found() -> None:
    modules = library_modules()
    assert "truba.client.client" in modules and "truba.pipes.stacks" in modules
    assert COMPOSITION_ROOTS <= modules.keys()


@pytest.mark.parametrize("root", sorted(COMPOSITION_ROOTS))
def test_each_composition_root_picks_the_transport(root: str) -> None:
    assert any(names_transport(name) for name in imported_names(library_modules()[root]))


def test_only_the_leaves_and_the_composition_roots_import_the_transport() -> None:
    offenders = {
        module: sorted(name for name in imported_names(path) if names_transport(name))
        for module, path in library_modules().items()
        if module not in COMPOSITION_ROOTS
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_a_violation_is_caught(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("def f():\n    from truba.pipes.rabbit import RabbitBroker\n    return RabbitBroker\n")
    assert any(names_transport(name) for name in imported_names(sneaky))
