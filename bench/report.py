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


class Steal:
    """The share of the machine's CPU time its hypervisor gave to others (``steal`` in
    /proc/stat) since the last :meth:`lap`: how noisy a measurement's surroundings were."""

    def __init__(self) -> None:
        self._last = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            with open("/proc/stat") as stat:
                ticks = [int(field) for field in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        return (ticks[7] if len(ticks) > 7 else 0), sum(ticks)

    def lap(self) -> float:
        """Stolen share of all CPU time since the previous lap (0.0 where unknown)."""
        now = self._read()
        stolen, total = now[0] - self._last[0], now[1] - self._last[1]
        self._last = now
        return stolen / total if total > 0 else 0.0
