"""Handlers the test suite's jobs run (importable as ``tests.handlers``)."""
