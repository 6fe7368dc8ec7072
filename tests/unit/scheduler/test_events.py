"""WatchJob's event hub: coalesced kinds per watcher."""

from __future__ import annotations

import asyncio

from truba.scheduler.events import EventKind, JobEvents


async def test_a_watcher_sees_each_kind_once_in_first_happened_order() -> None:
    hub = JobEvents()
    watch = hub.watch("j")
    for kind in (EventKind.PROGRESS, EventKind.SLOTS, EventKind.PROGRESS, EventKind.STATE):
        hub.publish("j", kind)
    hub.publish("other", EventKind.STATE)
    changes = watch.changes()
    assert await anext(changes) == [EventKind.PROGRESS, EventKind.SLOTS, EventKind.STATE]
    watch.close()
    assert not hub.watched("j")


async def test_closing_the_hub_ends_every_watch() -> None:
    hub = JobEvents()
    watch = hub.watch("j")

    async def drain() -> list[list[EventKind]]:
        return [kinds async for kinds in watch.changes()]

    task = asyncio.create_task(drain())
    await asyncio.sleep(0)
    hub.publish("j", EventKind.SLOTS)
    await asyncio.sleep(0)
    hub.close()
    assert await asyncio.wait_for(task, 1.0) == [[EventKind.SLOTS]]
