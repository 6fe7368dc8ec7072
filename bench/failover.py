"""Scheduler failover: time from a leader's kill -9 to the first assignment of the new leader.

Two schedulers in high availability on one PostgreSQL (Debian's package, run by
``tests/postgres.py``), one local broker, and a daemon's link (the real
:class:`~truba.daemon.control.SchedulerLink`, in this process) given both addresses. Each round
kills the leader with -9, waits until the link applies an assignment of a higher epoch, then
starts the killed scheduler again as the standby. Reported per round: the kill to the new
leader's lease (from its log), and to the first assignment the daemon applied from it.

    python bench/failover.py [--kills 20] [--ttl 3] [--json bench/results/failover.json]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

from report import Steal, percentile, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Recorder:
    """A daemon's side of the link: records when each assignment came, with its epoch."""

    def __init__(self) -> None:
        self.applied: list[tuple[float, int]] = []

    def hello(self):  # type: ignore[no-untyped-def]
        from truba.proto.v1 import daemons_pb2

        return daemons_pb2.Hello(daemon_id="bench", hostname="bench", pid=1, slots=1, allow=["tests.*"])

    def heartbeat(self):  # type: ignore[no-untyped-def]
        from truba.proto.v1 import daemons_pb2

        return daemons_pb2.Heartbeat()

    def welcome(self, welcome: object) -> None:
        pass

    def assign(self, assignment: object) -> None:
        self.applied.append((time.monotonic(), int(assignment.epoch)))  # type: ignore[attr-defined]

    def drain(self, reason: str = "scheduler") -> None:
        pass


async def measure(kills: int, ttl: float, folder: Path) -> dict[str, object]:
    from tests.integration.ha_rig import Schedulers, events, wait_for_line
    from tests.postgres import LocalPostgres
    from truba.daemon.control import SchedulerLink
    from truba.local import start_nodes
    from truba.local.cluster import LocalCluster

    postgres = LocalPostgres()
    postgres.start()
    (node,) = start_nodes(folder / "rmq", 1)
    local = LocalCluster(folder / "cluster")
    stop = asyncio.Event()
    rows: list[dict[str, float]] = []
    try:
        schedulers = Schedulers(local, [node.url], postgres.create_database())
        extra = ("--lease-ttl", str(ttl))
        await asyncio.to_thread(schedulers.start, 0, *extra)
        await asyncio.to_thread(schedulers.start, 1, *extra)
        recorder = Recorder()
        link = SchedulerLink(schedulers.address, recorder)
        running = asyncio.create_task(link.run(stop))
        leader_index = 0
        for kill in range(kills):
            leader = schedulers.processes[leader_index]
            standby_index = 1 - leader_index
            standby = schedulers.processes[standby_index]
            await _until(lambda: bool(recorder.applied) and link.is_connected)
            epoch = max(e for _, e in recorder.applied)
            await asyncio.to_thread(wait_for_line, standby, '"sched.standby"')
            await asyncio.sleep(1.0)  # the standby polls, the leader renews: a steady state
            wall, killed = time.time(), time.monotonic()
            leader.kill()
            await _until(lambda seen=epoch: any(e > seen for _, e in recorder.applied), 30.0)
            applied = min(t for t, e in recorder.applied if e > epoch)
            acquired = events(standby, "sched.lease.acquired")[-1]
            rows.append({"lease": acquired["at"] - wall, "assignment": applied - killed})
            print(
                f"kill {kill + 1:2d}: lease after {rows[-1]['lease']:.2f} s,"
                f" first assignment after {rows[-1]['assignment']:.2f} s"
            )
            # The killed one comes back as the standby (its log continues)
            local.processes.remove(leader)
            schedulers.processes[leader_index] = local.spawn(leader.name, leader.args)
            await asyncio.to_thread(
                wait_for_line, schedulers.processes[leader_index], "truba scheduler listening on "
            )
            leader_index = standby_index
        stop.set()
        await asyncio.wait_for(running, 10)
    finally:
        stop.set()
        await asyncio.to_thread(local.stop)
        node.stop()
        postgres.close()
    result: dict[str, object] = {"kills": kills, "ttl": ttl, "rounds": rows}
    for key in ("lease", "assignment"):
        values = [row[key] for row in rows]
        result[key] = {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values)}
    return result


async def _until(check: object, timeout: float = 30.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("not within the time")
        await asyncio.sleep(0.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--ttl", type=float, default=3.0, help="the schedulers' --lease-ttl")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "failover.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the link's warnings while no leader exists are expected
    steal = Steal()
    with tempfile.TemporaryDirectory(prefix="truba-failover-") as folder:
        result = asyncio.run(measure(args.kills, args.ttl, Path(folder)))
    result["steal"] = round(steal.lap(), 3)
    print()
    print(f"{'from kill -9 to':<32}{'p50':>8}{'p99':>8}{'max':>8}")
    for key, title in (("lease", "the new leader's lease"), ("assignment", "its first assignment applied")):
        stats = result[key]
        assert isinstance(stats, dict)
        print(f"{title:<32}{stats['p50']:>7.2f}s{stats['p99']:>7.2f}s{stats['max']:>7.2f}s")
    print(f"(lease ttl {args.ttl:g} s, standby poll 0.5 s; {args.kills} kills; steal {result['steal']:.1%})")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
