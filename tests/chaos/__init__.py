"""The chaos run: a seeded nemesis injects faults into a whole local truba cluster while jobs run,
and a checker verifies every task's outcome at the client (see docs/chaos.md)."""
