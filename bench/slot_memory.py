"""Memory of N slots whose handler module holds a large object: spawned versus forked from a template.

The handler module (``bench/ballast_handler.py``, imported by the slots) allocates
``--ballast`` MiB of bytes at import, as a handler that loads a model or a table would. Each
slot runs one task (so the module is imported, or found preloaded), then the processes are
measured from ``/proc/<pid>/smaps_rollup``:

  PSS   proportional set size: shared pages split among the processes sharing them, so the sum
        over all processes is what they cost the machine together
  USS   private memory (what the daemon's memory limits measure, :mod:`truba.daemon.memory`)

For ``fork`` the template process is counted too (it holds the preloaded module).

    python bench/slot_memory.py [--slots 4] [--ballast 50] [--json bench/results/slot_memory.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from report import write_json

ROOT = Path(__file__).resolve().parent.parent
HANDLER = "bench.ballast_handler:size"
MIB = 1024 * 1024


def rollup(pid: int) -> dict[str, int]:
    """Rss, Pss and private bytes of a process."""
    fields = {"Rss": 0, "Pss": 0, "Private": 0}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        kib = int(parts[0]) * 1024
        if key in ("Rss", "Pss"):
            fields[key] += kib
        elif key in ("Private_Clean", "Private_Dirty", "Private_Hugetlb"):
            fields["Private"] += kib
    return fields


async def measure(how: str, slots: int) -> dict[str, object]:
    from truba.daemon.forkserver import ForkServer
    from truba.daemon.launch import Launcher, Spawn
    from truba.daemon.slot_process import SlotProcess

    launcher: Launcher = ForkServer([HANDLER]) if how == "fork" else Spawn()
    processes = [SlotProcess(i, launcher) for i in range(slots)]
    try:
        for slot in processes:
            reply = await slot.run(HANDLER, "t", None)
            assert reply.ok, reply
        await asyncio.sleep(0.5)
        pids = [slot.pid for slot in processes if slot.pid is not None]
        per_slot = [rollup(pid) for pid in pids]
        template = launcher.template if isinstance(launcher, ForkServer) else None
        extra = [rollup(template.pid)] if template is not None and template.pid is not None else []
        everything = per_slot + extra
        return {
            "slots": slots,
            "pss_total_mib": round(sum(p["Pss"] for p in everything) / MIB, 1),
            "rss_total_mib": round(sum(p["Rss"] for p in everything) / MIB, 1),
            "uss_per_slot_mib": round(sum(p["Private"] for p in per_slot) / len(per_slot) / MIB, 1),
            "pss_per_slot_mib": round(sum(p["Pss"] for p in per_slot) / len(per_slot) / MIB, 1),
            "template_pss_mib": round(extra[0]["Pss"] / MIB, 1) if extra else None,
        }
    finally:
        for slot in processes:
            await slot.stop()
        await launcher.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--ballast", type=int, default=50, help="MiB the handler module allocates")
    parser.add_argument("--json", type=Path, default=Path("bench/results/slot_memory.json"))
    args = parser.parse_args()
    # Slots import the handler as bench.slot_memory, with the ballast size from the environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["TRUBA_BENCH_BALLAST_MIB"] = str(args.ballast)
    sys.path[:0] = [str(ROOT)]
    os.chdir(ROOT)
    result: dict[str, object] = {"ballast_mib": args.ballast}
    for how in ("spawn", "fork"):
        result[how] = asyncio.run(measure(how, args.slots))
    print(f"\n{args.slots} slots, handler module holding {args.ballast} MiB")
    print(
        f"{'launcher':<10}{'PSS total':>11}{'RSS total':>11}{'PSS/slot':>10}{'USS/slot':>10}{'template':>10}"
    )
    for how in ("spawn", "fork"):
        row: dict[str, float | None] = result[how]  # type: ignore[assignment]
        template = "-" if row["template_pss_mib"] is None else f"{row['template_pss_mib']:.1f}"
        print(
            f"{how:<10}{row['pss_total_mib']:>11.1f}{row['rss_total_mib']:>11.1f}"
            f"{row['pss_per_slot_mib']:>10.1f}{row['uss_per_slot_mib']:>10.1f}{template:>10}"
        )
    print("(MiB; PSS total counts the template for fork)")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
