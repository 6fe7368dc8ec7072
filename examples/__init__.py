"""Example jobs for truba: run them against `truba up` (see the README)."""
