"""truba.daemon: the compute daemon, one per node, running jobs' tasks in slot subprocesses."""

__all__: list[str] = []
"""Nothing is re-exported here: slot processes import this package and must stay light. The daemon
is :class:`truba.daemon.daemon.Daemon` (its composition root: :mod:`truba.daemon.wiring`)."""
