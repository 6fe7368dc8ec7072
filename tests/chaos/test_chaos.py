"""The short chaos run of CI: about a minute of every kind of fault over a whole local cluster
with a fixed seed, then the checker (see docs/chaos.md; ``scripts/soak`` is the long run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.plan import FAULT_KINDS
from tests.chaos.run import run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SEED = int(os.environ.get("TRUBA_CHAOS_SEED", "18"))
FAULT_SECONDS = 60.0
FINISH_SECONDS = 150.0
"""The jobs' last outcomes after the faults: seconds on an idle machine; the bound is for a loaded one."""


async def test_a_short_chaos_run_loses_duplicates_and_corrupts_no_outcome(tmp_path: Path) -> None:
    result = await run(SEED, FAULT_SECONDS, FINISH_SECONDS, tmp_path / "run")
    print("\n" + result.report())
    assert result.finished, "the jobs did not finish after the faults\n" + result.report()
    assert result.verdict.ok, result.report()
    assert result.anomalies == [], result.report()
    # The nemesis did hit: every lasting kind, and most instant ones (a slot, template or
    # importance fault finds nothing to hit while its daemon or the scheduler restarts, or when a
    # loaded machine made the daemon spawn its slots without a template, and is then skipped).
    assert len(result.injected) >= len(FAULT_KINDS) - 3, result.report()
