"""``truba timeline JOB [JOB ...] -o FILE.html|FILE.png``: the jobs' task attempts over time.

A lane per daemon and slot, a bar per attempt coloured by how it ended (by job when several are
drawn), preemptions, failures, retries and give-ups marked (:mod:`truba.timeplot`). ``--json``
prints the spans instead; with neither, a table counts each lane's attempts by outcome. The
spans come from the scheduler's memory (``GetTimeline``): the newest ones per job, kept for a
while after the job ended (see docs/operations.md, Timeline).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from truba.cli.exits import OK, USAGE, CliError
from truba.cli.render import print_json, print_table
from truba.cli.session import add_client_arguments, session
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc
from truba.timeplot import Span, spans_of

FORMATS = (".html", ".png")
_COLUMNS = ("ok", "error", "retried", "timeout", "crashed", "preempted", "gave_up", "slot_taken")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``timeline``."""
    parser = sub.add_parser(
        "timeline",
        help="draw jobs' task attempts per daemon and slot over time (HTML or PNG)",
        description="Draw the task attempts of one or more jobs: a lane per daemon and slot, a bar per "
        "attempt coloured by outcome (by job when several), preemptions, failures, retries and "
        "give-ups marked. -o FILE.html writes one self-contained interactive page, -o FILE.png a "
        "picture; --json prints the spans; with neither, a table per lane.",
    )
    parser.add_argument(
        "job_ids", nargs="+", metavar="JOB_ID", help="the job's id (truba jobs --all lists them)"
    )
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write FILE.html or FILE.png")
    parser.add_argument(
        "--since", type=float, default=0.0, metavar="UNIX_TIME", help="only attempts that ended after this"
    )
    add_client_arguments(parser)
    parser.set_defaults(func=timeline)


def timeline(args: argparse.Namespace) -> int:
    output: Path | None = args.output
    if output is not None and output.suffix.lower() not in FORMATS:
        raise CliError(f"-o {output}: the file must end in .html or .png", USAGE)
    with session(args) as s:
        stub = jobs_pb2_grpc.JobServiceStub(s.channel)
        answers = [
            s.call(stub.GetTimeline, jobs_pb2.GetTimelineRequest(job_id=job_id, since=args.since))
            for job_id in args.job_ids
        ]
    spans = sorted((span for answer in answers for span in spans_of(answer)), key=lambda s: s.end)
    dropped = sum(answer.dropped + answer.left_out for answer in answers)
    if args.json:
        print_json(
            [
                {
                    "job_id": a.job_id,
                    "dropped": a.dropped,
                    "left_out": a.left_out,
                    "spans": [s.to_json() for s in spans_of(a)],
                }
                for a in answers
            ]
        )
    elif output is not None:
        _write(output, spans, args.job_ids, dropped)
        print(f"{output}: {len(spans)} attempts on {len({s.lane for s in spans})} slots")
    else:
        _table(spans)
    return OK


def _write(output: Path, spans: list[Span], job_ids: list[str], dropped: int) -> None:
    from truba.timeplot import write_html, write_png  # matplotlib loads only for a picture

    title = f"truba timeline: job {', '.join(job_ids)}"
    summary = f"{len(spans)} attempts" + (
        f", {dropped} older or unreported ones not shown" if dropped else ""
    )
    try:
        if output.suffix.lower() == ".png":
            write_png(output, spans, f"{title} ({summary})")
        else:
            write_html(output, spans, title, summary)
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc.strerror or exc}") from None


def _table(spans: list[Span]) -> None:
    counts: dict[tuple[str, int], Counter[str]] = {}
    for span in spans:
        counts.setdefault((span.daemon_id, span.slot), Counter())[span.outcome] += 1
    rows = [
        [daemon, slot, *(counted[c] for c in _COLUMNS)] for (daemon, slot), counted in sorted(counts.items())
    ]
    headers = ["DAEMON", "SLOT", *(c.upper() for c in _COLUMNS)]
    print_table(headers, rows, right=frozenset(range(1, len(headers))))
