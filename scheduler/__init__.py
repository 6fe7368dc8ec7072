"""truba's scheduler: jobs, daemons and which daemon's slots serve which job.

It keeps jobs in SQLite or PostgreSQL (:mod:`~truba.scheduler.store`), declares and deletes their queues on
every broker (:mod:`~truba.scheduler.brokers`, :mod:`~truba.scheduler.janitor`), plans slots
with a pure function (:mod:`~truba.scheduler.planner`) and pushes each daemon its share over
the Connect stream (:mod:`~truba.scheduler.assigner`, :mod:`~truba.scheduler.daemons`). The
gRPC services are in :mod:`~truba.scheduler.jobs` and :mod:`~truba.scheduler.daemons`; the
process in :mod:`~truba.scheduler.server`, the command line in :mod:`~truba.scheduler.cli`.

Run one in-process::

    from truba.scheduler import Scheduler, SchedulerConfig

    async with Scheduler(SchedulerConfig(brokers=["amqp://guest:guest@127.0.0.1:5672/"],
                                         state_dir=Path("state"), listen="127.0.0.1:0")) as s:
        print(s.address)
"""

from __future__ import annotations

from truba.scheduler.server import DEFAULT_LISTEN, Scheduler, SchedulerConfig

__all__ = ["DEFAULT_LISTEN", "Scheduler", "SchedulerConfig"]
