"""``truba jobs`` (list), ``truba job ID`` (one job in full; ``--dead``: its dead letters;
``--running``: its tasks running now) and ``truba cancel ID``."""

from __future__ import annotations

import argparse

from truba.cli.dead import DEFAULT_LIMIT, MAX_LIMIT, check_limit, show_dead_letters
from truba.cli.exits import OK, USAGE, CliError
from truba.cli.render import iso_time, job_dict, job_name, job_state, print_json, print_table
from truba.cli.running import show_running
from truba.cli.session import add_client_arguments, session
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``jobs``, ``job`` and ``cancel``."""
    parser = sub.add_parser(
        "jobs",
        help="list jobs",
        description="List the scheduler's jobs with their share, slots and counts (DONE and FAILED count "
        "each task's outcome once; a finished job's counts are final).",
    )
    add_client_arguments(parser)
    parser.add_argument("--all", action="store_true", help="include finished and cancelled jobs")
    parser.set_defaults(func=list_jobs)

    parser = sub.add_parser(
        "job",
        help="show one job",
        description="Show one job: state, importance, share, slots, counts, settings and any problem; "
        "with --dead, its dead letters (tasks given up, poison, refused by a broker) instead; with "
        "--running, its tasks running now (task, daemon, slot, attempt, since when, for how long).",
    )
    parser.add_argument("job_id", metavar="JOB_ID", help="the job's id (truba jobs --all lists them)")
    add_client_arguments(parser)
    parser.add_argument(
        "--dead",
        action="store_true",
        help="list the job's dead letters: task, reason, attempts, broker (and daemon), error; "
        "they are kept a while after the job ends (the scheduler's --keep-dead)",
    )
    parser.add_argument(
        "--running",
        action="store_true",
        help="list the job's tasks running now, oldest first: task, daemon, slot, attempt, since when "
        "and for how long (as of each daemon's last heartbeat)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help=f"with --dead: show the first N (default {DEFAULT_LIMIT}, at most {MAX_LIMIT})",
    )
    parser.set_defaults(func=show_job)

    parser = sub.add_parser(
        "cancel",
        help="cancel a job",
        description="Cancel a job: it stops at once, its queues are deleted and its tasks without an "
        "outcome get none. Cancelling a cancelled job again is a no-op.",
    )
    parser.add_argument("job_id", metavar="JOB_ID", help="the job's id (truba jobs --all lists them)")
    add_client_arguments(parser)
    parser.set_defaults(func=cancel_job)


def list_jobs(args: argparse.Namespace) -> int:
    with session(args) as s:
        stub = jobs_pb2_grpc.JobServiceStub(s.channel)
        jobs = s.call(stub.ListJobs, jobs_pb2.ListJobsRequest(include_done=args.all)).jobs
    if args.json:
        print_json([job_dict(job) for job in jobs])
        return OK
    headers = ["ID", "NAME", "STATE", "IMPORTANCE", "SHARE", "SLOTS", "RUNNING", "DONE", "FAILED", "BACKLOG"]
    rows = [
        [
            job.id,
            job_name(job),
            job_state(job),
            f"{job.importance:g}",
            f"{job.fair_share:.1f}",
            job.assigned_slots,
            job.counts.running,
            job.counts.done,
            job.counts.failed,
            job.counts.backlog,
        ]
        for job in jobs
    ]
    print_table(headers, rows, right=frozenset(range(3, 10)))
    return OK


def show_job(args: argparse.Namespace) -> int:
    if args.limit is not None and not args.dead:
        raise CliError("--limit goes with --dead", USAGE)
    if args.dead and args.running:
        raise CliError("--dead and --running: one at a time", USAGE)
    if args.running:
        with session(args) as s:
            return show_running(s, args.job_id, as_json=args.json)
    if args.dead:
        limit = DEFAULT_LIMIT if args.limit is None else args.limit
        check_limit(limit)
        with session(args) as s:
            return show_dead_letters(s, args.job_id, limit=limit, as_json=args.json)
    with session(args) as s:
        stub = jobs_pb2_grpc.JobServiceStub(s.channel)
        job = s.call(stub.GetJob, jobs_pb2.GetJobRequest(job_id=args.job_id))
    if args.json:
        print_json(job_dict(job))
    else:
        print_job(job)
    return OK


def cancel_job(args: argparse.Namespace) -> int:
    with session(args) as s:
        stub = jobs_pb2_grpc.JobServiceStub(s.channel)
        job = s.call(stub.CancelJob, jobs_pb2.CancelJobRequest(job_id=args.job_id))
    if args.json:
        print_json(job_dict(job))
    else:
        print(f"job {job.id}: {job_state(job)}")
    return OK


def print_job(job: jobs_pb2.Job) -> None:
    """``job`` as ``key  value`` lines."""
    row = job_dict(job)
    c, s = job.counts, row["settings"]
    assert isinstance(s, dict)
    lines = [
        ("job", job.id),
        ("name", job.name or "-"),
        ("handler", job.handler),
        ("state", job_state(job)),
        ("importance", f"{job.importance:g}"),
        ("share", f"{job.fair_share:.2f} slots (fair share); {job.assigned_slots} assigned"),
        (
            "counts",
            f"submitted {c.submitted}, done {c.done}, failed {c.failed}, running {c.running}, "
            f"backlog {c.backlog}" + (f"; {c.service_time:.3g} s a task" if c.service_time else ""),
        ),
        ("settings", ", ".join(f"{key} {_setting(key, value)}" for key, value in s.items())),
        ("created", iso_time(job.created_at) or "-"),
        ("closed", iso_time(job.closed_at) or "-"),
        ("ended", iso_time(job.finished_at) or "-"),
        ("problem", job.problem or "-"),
    ]
    width = max(len(key) for key, _ in lines)
    for key, value in lines:
        print(f"{key:<{width}}  {value}")


def _setting(key: str, value: object) -> str:
    if key in ("max_slots", "task_timeout", "preemption_grace") and value == 0:
        return "none"  # 0: no limit
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
