"""The builder: compose layers outermost-first, and print the stack as a list of names.

::

    sender = (
        pipeline(TaskMessage)
        .layer(serialize(TaskCodec()))     # sees each message first
        .layer(spool(path))
        .layer(retry(Backoff()))
        .build(balance([reopen_sender(connect) for connect in brokers]))
    )
    print(describe(sender))   # serialize → spool → retry → balance[reopen → rabbit, ...]

mypy checks that adjacent layers agree on message types. :func:`describe` walks the built
stack through each layer's ``inner`` (or a combinator's ``inners``) and names every block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar, final

from truba.pipes.base import Listener, Sender

T = TypeVar("T")
X = TypeVar("X")
In = TypeVar("In")
Out = TypeVar("Out")


@final
class Pipeline(Generic[Out, In]):
    """A stack under construction: ``Sender[In] -> Sender[Out]``; the first ``.layer()`` is outermost."""

    def __init__(self, wrap: Callable[[Sender[In]], Sender[Out]]) -> None:
        self._wrap = wrap

    def layer(self, layer: Callable[[Sender[X]], Sender[In]]) -> Pipeline[Out, X]:
        wrap = self._wrap
        return Pipeline(lambda inner: wrap(layer(inner)))

    def build(self, base: Sender[In]) -> Sender[Out]:
        return self._wrap(base)


@final
class ListenerPipeline(Generic[Out, In]):
    """The same for listeners: ``Listener[In] -> Listener[Out]``, outermost first."""

    def __init__(self, wrap: Callable[[Listener[In]], Listener[Out]]) -> None:
        self._wrap = wrap

    def layer(self, layer: Callable[[Listener[X]], Listener[In]]) -> ListenerPipeline[Out, X]:
        wrap = self._wrap
        return ListenerPipeline(lambda inner: wrap(layer(inner)))

    def build(self, base: Listener[In]) -> Listener[Out]:
        return self._wrap(base)


def pipeline(message_type: type[T]) -> Pipeline[T, T]:
    """Starts a sender stack for messages of ``message_type``."""
    return Pipeline(lambda sender: sender)


def listener_pipeline(message_type: type[T]) -> ListenerPipeline[T, T]:
    """Starts a listener stack for messages of ``message_type``."""
    return ListenerPipeline(lambda listener: listener)


def block_name(block: object) -> str:
    """A block's name: its ``name`` attribute, else its class name without Sender/Listener."""
    name = getattr(block, "name", None)
    if isinstance(name, str):
        return name
    cls = type(block).__name__
    for suffix in ("Sender", "Listener"):
        if cls.endswith(suffix) and cls != suffix:
            cls = cls[: -len(suffix)]
    return cls.lower()


def describe(stack: object) -> str:
    """The stack as text, outermost first: ``serialize → retry → balance[reopen → rabbit, ...]``."""
    parts: list[str] = []
    block: object | None = stack
    while block is not None:
        inners: Sequence[object] | None = getattr(block, "inners", None)
        if inners is not None:
            parts.append(f"{block_name(block)}[{', '.join(describe(i) for i in inners)}]")
            break
        parts.append(block_name(block))
        block = getattr(block, "inner", None)
    return " → ".join(parts)
