"""The nemesis: applies a planned schedule of faults to a :class:`~tests.chaos.rig.Rig`, one at a
time, and logs each with its timestamps.

Each fault is injected, held for its planned time, then healed (a killed process is started
again, a stalled proxy passes again, an alarm is cleared) before the next one; instant faults
(a slot, a template, a cut, an importance) heal themselves. Between faults it supervises: a
daemon, the scheduler or the client that died without being killed is an *anomaly* (logged,
counted, started again), not a fault.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final

from tests.chaos import procs
from tests.chaos.plan import Fault
from tests.chaos.rig import Rig
from truba.client import Client
from truba.errors import TrubaError

log = logging.getLogger("chaos.nemesis")
INSTANT: Final = frozenset({"slot_kill", "template_kill", "cut", "importance"})
"""Kinds that need no heal: they run in a lane of their own, overlapping the lasting ones."""
RETRIES: Final = 3
"""Tries more of an instant fault that found nothing to hit (no slot, no template, no live job)."""


class Nemesis:
    def __init__(self, rig: Rig, seed: int, out: IO[str], echo: bool = True) -> None:
        self.rig = rig
        self.rng = random.Random(seed ^ 0x5EED)  # targets within a fault (which slot)
        self.out = out
        self.echo = echo
        self.t0 = time.time()
        self.injected: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.anomalies: list[str] = []
        self.client_kills: list[tuple[int, float]] = []

    def note(self, event: str, **fields: object) -> None:
        now = time.time()
        record = {
            "t": round(now - self.t0, 2),
            "utc": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds"),
            "event": event,
            **fields,
        }
        line = json.dumps(record)
        self.out.write(line + "\n")
        self.out.flush()
        if self.echo:
            print(f"[chaos {record['t']:7.1f}s] {event} {json.dumps(fields)}", flush=True)

    async def run(self, faults: list[Fault], until: float) -> None:
        """Applies ``faults`` (times relative to ``self.t0``) in two lanes, then supervises until
        ``until`` s: the faults that last (kills and restarts, stalls, alarms) one after the
        other, and the instant ones (a slot, a template, a cut, an importance) at their planned
        times, which fall on the others' holds."""
        lasting = [f for f in faults if f.kind not in INSTANT]
        instant = [f for f in faults if f.kind in INSTANT]
        await asyncio.gather(self._lane(lasting, until, supervise=True), self._lane(instant, until))
        await self._supervise_until(self.t0 + until)

    async def _lane(self, faults: list[Fault], until: float, supervise: bool = False) -> None:
        for fault in faults:
            if fault.at > until:
                break
            if supervise:
                await self._supervise_until(self.t0 + fault.at)
            else:
                await asyncio.sleep(max(0.0, self.t0 + fault.at - time.time()))
            began = time.time()
            try:
                detail = await self._apply(fault)
                for _ in range(RETRIES if fault.kind in INSTANT else 0):
                    if detail is not None:
                        break
                    await asyncio.sleep(2.0)  # nothing to hit yet (a daemon starting): again
                    detail = await self._apply(fault)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be applied is logged
                self.skipped[fault.kind] += 1
                self.note("fault.failed", kind=fault.kind, target=fault.target, error=repr(exc))
                continue
            if detail is None:
                self.skipped[fault.kind] += 1
                continue
            self.injected[fault.kind] += 1
            self.note(
                "fault", kind=fault.kind, target=fault.target, hold=fault.hold,
                began=round(began - self.t0, 2), took=round(time.time() - began, 2), **detail,
            )  # fmt: skip

    async def _supervise_until(self, deadline: float) -> None:
        while time.time() < deadline:
            await self.supervise()
            await asyncio.sleep(min(0.5, max(0.0, deadline - time.time())))

    async def supervise(self) -> bool:
        """Starts again whatever died without a fault; True once the client exited 0 (done)."""
        rig = self.rig
        for i, daemon in enumerate(rig.daemons):
            if not daemon.alive():
                self.anomaly(f"daemon d{i} exited {daemon.popen.returncode}")
                await asyncio.to_thread(rig.restart_daemon, i)
        if rig.scheduler is not None and not rig.scheduler.alive():
            self.anomaly(f"scheduler exited {rig.scheduler.popen.returncode}")
            await asyncio.to_thread(rig.restart_scheduler)
        if rig.client is not None and (code := rig.client.poll()) is not None:
            if code == 0:
                return True
            self.anomaly(f"client exited {code}")
            rig.start_client()
        return False

    def anomaly(self, what: str) -> None:
        self.anomalies.append(what)
        self.note("anomaly", what=what)

    async def _apply(self, fault: Fault) -> dict[str, object] | None:
        rig, kind, hold = self.rig, fault.kind, fault.hold
        if kind == "broker_kill":
            node = rig.nodes[fault.target]
            await asyncio.to_thread(node.kill)
            await asyncio.sleep(hold)
            began = time.time()
            await asyncio.to_thread(node.restart, 180.0)
            return {"restart_s": round(time.time() - began, 1)}
        if kind == "daemon_kill":
            rig.daemons[fault.target].kill()
            await asyncio.sleep(hold)
            await asyncio.to_thread(rig.restart_daemon, fault.target)
            return {}
        if kind in ("slot_kill", "template_kill"):
            daemon = rig.daemons[fault.target]
            pids = procs.templates(daemon.pid) if kind == "template_kill" else procs.slots(daemon.pid)
            if not pids:
                self.note("fault.skipped", kind=kind, target=fault.target, why="none running")
                return None
            pid = self.rng.choice(sorted(pids))
            os.kill(pid, signal.SIGKILL)
            return {"pid": pid}
        if kind == "scheduler_kill":
            assert rig.scheduler is not None
            rig.scheduler.kill()
            await asyncio.sleep(hold)
            await asyncio.to_thread(rig.restart_scheduler)
            return {}
        if kind == "client_kill":
            client = rig.client
            if client is None or client.poll() is not None:
                return None
            client.kill()
            await asyncio.to_thread(client.wait)
            self.client_kills.append((client.pid, time.time()))
            await asyncio.sleep(hold)
            rig.start_client()
            return {"pid": client.pid}
        if kind == "stall":
            proxy = rig.proxies[fault.target]
            await asyncio.to_thread(proxy.stall)
            await asyncio.sleep(hold)
            await asyncio.to_thread(proxy.pass_)
            return {}
        if kind == "cut":
            return {"connections": await asyncio.to_thread(rig.proxies[fault.target].cut)}
        if kind == "alarm":
            node = rig.nodes[fault.target]
            await asyncio.to_thread(node.set_memory_alarm, True)
            await asyncio.sleep(hold)
            await asyncio.to_thread(node.set_memory_alarm, False)
            return {}
        if kind == "importance":
            return await self._flip_importance(fault)
        raise ValueError(f"unknown fault kind {kind!r}")

    async def _flip_importance(self, fault: Fault) -> dict[str, object] | None:
        state = self.rig.workdir / "client" / "state.json"
        try:
            data = json.loads(state.read_text())
        except (OSError, ValueError):
            self.note("fault.skipped", kind="importance", why="no job yet")
            return None
        live = sorted(set(data.get("jobs", {})) - set(data.get("done", [])))
        if not live:
            self.note("fault.skipped", kind="importance", why="no live job")
            return None
        tag = live[fault.target % len(live)]
        try:
            async with Client(self.rig.cluster.address, journal=False) as client:
                await asyncio.wait_for(client.job(data["jobs"][tag]).set_importance(fault.value), 10)
        except (TrubaError, TimeoutError) as exc:
            self.note("fault.skipped", kind="importance", tag=tag, why=repr(exc))
            return None
        return {"tag": tag, "importance": fault.value}


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=1))
