"""Prints what ``sitecustomize.py`` counted, per process and queue, per task.

python bench/amqp_count/summary.py FOLDER TASKS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    folder, tasks = Path(sys.argv[1]), int(sys.argv[2])
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        counts: dict[str, int] = data["counts"]
        if not any(not key.startswith("loop") for key in counts):
            continue
        print(f"{path.stem} ({data['argv']}):")
        for key, value in sorted(counts.items()):
            print(f"  {key:<60} {value:>9}  {value / tasks:>9.4f} per task")
    return 0


if __name__ == "__main__":
    sys.exit(main())
