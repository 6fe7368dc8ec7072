"""The root of truba's errors.

Every error truba raises on purpose derives from :class:`TrubaError`, so an application can catch
them all in one place. The families live beside their part: pipe errors in
:mod:`truba.pipes.errors`, scheduler answers in :mod:`truba.client.errors` (client side) and
:mod:`truba.scheduler.errors` (server side), outcomes in :mod:`truba.client.outcome`.
"""

from __future__ import annotations

__all__ = ["TrubaError"]


class TrubaError(Exception):
    """Base of every error truba raises on purpose."""
