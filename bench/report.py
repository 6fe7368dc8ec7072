"""What every benchmark does with its numbers: percentiles, and the JSON file it writes."""

from __future__ import annotations

import json
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def write_json(path: Path, data: object) -> None:
    """Writes ``data`` to ``path`` (folders made as needed) and says so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    print(f"\nwritten {path}")
