"""The scheduler's HTTP face: Prometheus metrics and a read-only JSON API.

``truba scheduler --http HOST:PORT`` serves (loopback by default; read-only, so the worst an
exposed port does is tell what runs):

- ``GET /``: the dashboard (``static/``: a page, a script and a style sheet, nothing fetched
  from elsewhere), which polls the JSON API below every second;
- ``GET /metrics``: Prometheus text format (:mod:`truba.scheduler.metrics`);
- ``GET /api/v1/jobs`` (``?all=1`` includes ended jobs), ``GET /api/v1/jobs/{id}``,
  ``GET /api/v1/daemons``: the same messages as the gRPC API, as JSON (protobuf's JSON mapping,
  field names as in the ``.proto`` files);
- ``GET /api/v1/history`` (every job) and ``GET /api/v1/jobs/{id}/history``: each job's numbers
  over its last minutes (:mod:`truba.scheduler.history`);
- ``GET /api/v1/jobs/{id}/timeline`` (``?since=UNIX_TIME&limit=N``): the job's task attempts per
  daemon and slot (:mod:`truba.scheduler.timeline`), flat: ``{"job_id", "dropped", "left_out",
  "spans": [{"daemon_id", "task_id", "slot", "start", "end", "outcome", "attempt", "error"}]}``,
  outcomes as words;
- ``GET /api/v1/jobs/{id}/running`` (``?limit=N``): the job's task attempts in progress
  (:mod:`truba.scheduler.running`), oldest start first: ``{"job_id", "left_out", "at",
  "running": [{"daemon_id", "hostname", "slot", "task_id", "attempt", "started_at"}]}``;
- ``GET /api/v1/schedules``: every periodic schedule with its last run, and
  ``GET /api/v1/schedules/{id}/runs``: its last runs, newest first (``truba.v1.Schedule`` and
  ``ScheduleRun`` as JSON);
- ``GET /api/v1/jobs/{id}/errors`` (``?limit=N``): the job's newest failed attempts, newest first,
  each a timeline span with its error's ``message`` (:meth:`TaskTimeline.errors_json`);
- ``GET /api/v1/jobs/{id}/dead`` (``?limit=N`` per broker): the job's dead letters without their
  bodies, as ``ListDeadLetters`` answers, read at most every few seconds per job
  (:mod:`truba.scheduler.dead_answers`; 504 when the brokers do not answer in time);
- ``GET /healthz``: ``ok`` while the scheduler serves.

With a bearer token configured, every path but ``/healthz`` and the dashboard's static files
requires ``Authorization: Bearer <token>`` (401 otherwise), as gRPC does; Prometheus sends one
with ``authorization: {credentials_file: ...}`` in its scrape config, and the dashboard, opened as
``/#token=SECRET``, keeps it in the browser tab (a URL fragment never reaches the server).
"""

from __future__ import annotations

import hmac
import importlib.resources
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
from aiohttp import web
from aiohttp.typedefs import Middleware
from google.protobuf import json_format
from google.protobuf.message import Message
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from truba.scheduler.dead_answers import DeadLetterAnswers
from truba.scheduler.errors import SchedulerError
from truba.scheduler.history import JobHistory
from truba.scheduler.metrics import SchedulerMetrics
from truba.scheduler.schedule_service import run_pb, schedule_pb
from truba.scheduler.schedules import ScheduleBook
from truba.scheduler.timeline import FAILURES, TaskTimeline
from truba.scheduler.view import ClusterView

log = logging.getLogger(__name__)

OPEN_PATHS: Final = frozenset({"/healthz", "/"})
OPEN_PREFIXES: Final = ("/static/",)
STATIC: Final = importlib.resources.files("truba.scheduler") / "static"
CONTENT_TYPES: Final = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
HTTP_STATUS: Final = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.UNAVAILABLE: 503,
}
"""A refusal's HTTP status by its gRPC code (anything else is a 500)."""
CSP: Final = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"
"""The dashboard loads nothing from elsewhere, and the browser is told so."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def build_app(
    view: ClusterView,
    metrics: SchedulerMetrics,
    history: JobHistory,
    *,
    token: str | None = None,
    timeline: TaskTimeline | None = None,
    schedules: ScheduleBook | None = None,
    dead: DeadLetterAnswers | None = None,
) -> web.Application:
    """The HTTP application over ``view``, ``metrics``, ``history``, ``timeline``, ``schedules``
    and ``dead`` (None: dead letters are not served, 503)."""
    spans = timeline or TaskTimeline()
    middlewares: list[Middleware] = [_bearer(token)] if token else []
    app = web.Application(middlewares=middlewares)

    async def scrape(request: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def jobs(request: web.Request) -> web.Response:
        include_done = request.query.get("all", "") not in ("", "0", "false")
        return web.json_response({"jobs": [_json(job) for job in view.jobs(include_done=include_done)]})

    async def job(request: web.Request) -> web.Response:
        try:
            found = view.job(request.match_info["job_id"])
        except SchedulerError as exc:
            return web.json_response({"error": str(exc)}, status=HTTP_STATUS.get(exc.code, 500))
        return web.json_response(_json(found))

    async def daemons(request: web.Request) -> web.Response:
        return web.json_response({"daemons": [_json(daemon) for daemon in view.daemons()]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def all_history(request: web.Request) -> web.Response:
        points = history.all()
        return web.json_response({job_id: [p.to_json() for p in job] for job_id, job in points.items()})

    async def job_history(request: web.Request) -> web.Response:
        return web.json_response([p.to_json() for p in history.of(request.match_info["job_id"])])

    async def job_timeline(request: web.Request) -> web.Response:
        try:
            found = view.job(request.match_info["job_id"])
            since = float(request.query.get("since", "0") or 0)
            limit = max(0, int(request.query.get("limit", "0") or 0))
        except SchedulerError as exc:
            return web.json_response({"error": str(exc)}, status=HTTP_STATUS.get(exc.code, 500))
        except ValueError:
            return web.json_response({"error": "since, limit: must be numbers"}, status=400)
        return web.json_response(spans.timeline_json(found.id, since, limit))

    async def job_running(request: web.Request) -> web.Response:
        try:
            limit = max(0, int(request.query.get("limit", "0") or 0))
        except ValueError:
            return web.json_response({"error": "limit: must be a number"}, status=400)
        try:
            return web.json_response(view.running_json(request.match_info["job_id"], limit))
        except SchedulerError as exc:
            return web.json_response({"error": str(exc)}, status=HTTP_STATUS.get(exc.code, 500))

    async def all_schedules(request: web.Request) -> web.Response:
        if schedules is None:
            return web.json_response({"schedules": []})
        shown = []
        for found in schedules.list():
            last = schedules.runs(found.id, 1)
            shown.append(_json(schedule_pb(found, last[0] if last else None)))
        return web.json_response({"schedules": shown})

    async def schedule_runs(request: web.Request) -> web.Response:
        if schedules is None:
            raise web.HTTPNotFound()
        try:
            runs = schedules.runs(request.match_info["schedule_id"])
        except SchedulerError as exc:
            return web.json_response({"error": str(exc)}, status=HTTP_STATUS.get(exc.code, 500))
        return web.json_response({"runs": [_json(run_pb(run)) for run in runs]})

    async def job_errors(request: web.Request) -> web.Response:
        try:
            found = view.job(request.match_info["job_id"])
            limit = int(request.query.get("limit", "") or FAILURES)
        except SchedulerError as exc:
            return web.json_response({"error": str(exc)}, status=HTTP_STATUS.get(exc.code, 500))
        except ValueError:
            return web.json_response({"error": "limit: must be a number"}, status=400)
        return web.json_response(spans.errors_json(found.id, limit))

    async def job_dead(request: web.Request) -> web.Response:
        if dead is None:
            return web.json_response({"error": "dead letters are not served here"}, status=503)
        try:
            limit = int(request.query.get("limit", "0") or 0)
            answer = await dead.answer(request.match_info["job_id"], limit)
        except SchedulerError as exc:
            return web.json_response({"error": str(exc)}, status=HTTP_STATUS.get(exc.code, 500))
        except ValueError:
            return web.json_response({"error": "limit: must be a number"}, status=400)
        except TimeoutError:
            return web.json_response({"error": "the brokers did not answer in time"}, status=504)
        return web.json_response(answer)

    async def static(request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        suffix = "." + name.rpartition(".")[2]
        resource = STATIC / name
        if "/" in name or suffix not in CONTENT_TYPES or not resource.is_file():
            raise web.HTTPNotFound()
        return web.Response(
            body=resource.read_bytes(),
            content_type=CONTENT_TYPES[suffix],
            headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP},
        )

    app.router.add_get("/metrics", scrape)
    app.router.add_get("/api/v1/jobs", jobs)
    app.router.add_get("/api/v1/jobs/{job_id}", job)
    app.router.add_get("/api/v1/daemons", daemons)
    app.router.add_get("/healthz", health)
    app.router.add_get("/api/v1/history", all_history)
    app.router.add_get("/api/v1/jobs/{job_id}/history", job_history)
    app.router.add_get("/api/v1/jobs/{job_id}/timeline", job_timeline)
    app.router.add_get("/api/v1/jobs/{job_id}/running", job_running)
    app.router.add_get("/api/v1/schedules", all_schedules)
    app.router.add_get("/api/v1/schedules/{schedule_id}/runs", schedule_runs)
    app.router.add_get("/api/v1/jobs/{job_id}/errors", job_errors)
    app.router.add_get("/api/v1/jobs/{job_id}/dead", job_dead)
    app.router.add_get("/", static)
    app.router.add_get("/static/{name}", static)
    return app


def _bearer(token: str) -> Middleware:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not request.path.startswith(OPEN_PREFIXES):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                log.warning("sched.http.refused", extra={"path": request.path, "peer": request.remote})
                return web.json_response(
                    {"error": "a valid 'Authorization: Bearer <token>' is required"},
                    status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return check
