"""A handler given as a function, named as daemons import it: ``"module:qualname"``.

Daemons import a job's handler by name in another process, so only a function reachable by that
name works: defined at the top level of an importable module (a method of a top-level class does
too, as ``module:Class.method``). Lambdas, functions defined inside functions, and functions of
``__main__`` (the script being run: a daemon's ``__main__`` is another program) are refused,
each with what to do instead.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from truba.client.errors import InvalidArgument


def handler_name(handler: str | Callable[..., object]) -> str:
    """``handler`` itself if it is a string, else the ``"module:qualname"`` of the function.

    Raises:
        InvalidArgument: a function daemons cannot import by name (the message says why and
            what to do), or something that is neither a string nor a function.
    """
    if isinstance(handler, str):
        return handler
    if isinstance(handler, functools.partial) or not callable(handler):
        raise _refused(f"must be a 'module:function' string or a module-level function, got {handler!r}")
    module = getattr(handler, "__module__", None)
    qualname = getattr(handler, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise _refused(f"{handler!r} has no module and name to import it by; pass 'module:function'")
    if qualname == "<lambda>" or qualname.endswith(".<lambda>"):
        raise _refused(
            "a lambda has no name a daemon can import it by; define it with def at the top level of a module"
        )
    if "<locals>" in qualname:
        raise _refused(
            f"{qualname} is defined inside a function, so a daemon cannot import it;"
            " move it to the top level of a module"
        )
    if module == "__main__":
        raise _refused(
            f"{qualname} is defined in __main__ (the script you run), which a daemon cannot import;"
            " move it into a module on the daemons' PYTHONPATH and import it from there"
        )
    name = f"{module}:{qualname}"
    if _resolve(module, qualname) is not handler:
        raise _refused(f"{name} does not name {handler!r} (is it shadowed or decorated?); pass the name")
    return name


def _resolve(module: str, qualname: str) -> object:
    try:
        found: object = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


def _refused(problem: str) -> InvalidArgument:
    return InvalidArgument("INVALID_ARGUMENT", f"handler: {problem}")
