from __future__ import annotations

import math

import pytest

from truba.daemon.settings import JobSettings as DaemonJobSettings
from truba.proto.v1 import common_pb2
from truba.scheduler.convert import settings_pb
from truba.scheduler.errors import InvalidArgument
from truba.scheduler.model import JobSettings, Preemption, QueueType
from truba.scheduler.store import settings_from_json, settings_json
from truba.scheduler.validate import (
    check_daemon_id,
    check_handler,
    check_importance,
    check_job_id,
    check_name,
    check_settings,
    check_slots,
    check_submitted,
)


@pytest.mark.parametrize(
    "handler", ["examples.math:square", "m:f", "pkg.sub.mod:Class.method", "_private._m:_f", "pkg2.mod_3:f4"]
)
def test_well_formed_handlers_pass(handler: str) -> None:
    assert check_handler(handler) == handler


@pytest.mark.parametrize(
    "handler",
    [
        "x",
        "examples.math",
        ":f",
        "m:",
        "a..b:f",
        "a.b:f:g",
        "1mod:f",
        "mod:f()",
        "mod: f",
        "os.system('x'):f",
    ],
)
def test_malformed_handlers_are_refused_naming_the_field(handler: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_handler(handler)
    assert str(caught.value) == f"handler: must look like 'package.module:function', got {handler!r}"
    assert caught.value.field == "handler"


def test_empty_and_huge_handlers_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"^handler: required$"):
        check_handler("")
    with pytest.raises(InvalidArgument, match=r"^handler: must be at most 512 characters"):
        check_handler("m" * 600 + ":f")


@pytest.mark.parametrize(
    ("importance", "shown"),
    [(-1.0, "-1"), (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")],
)
def test_importance_must_be_finite_and_positive(importance: float, shown: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_importance(importance)
    assert str(caught.value) == f"importance: must be a finite number > 0, got {shown}"


def test_positive_importance_passes() -> None:
    assert check_importance(0.001) == 0.001
    assert check_importance(1e9) == 1e9


def test_job_ids_are_required_and_well_formed() -> None:
    with pytest.raises(InvalidArgument, match=r"^job_id: required$"):
        check_job_id("")
    with pytest.raises(InvalidArgument, match=r"^job_id: must match \[a-z0-9\]\+"):
        check_job_id("ABC-1")
    with pytest.raises(InvalidArgument, match=r"^job_id: "):
        check_job_id("a" * 65)
    assert check_job_id("lz4k2m1xq7f3a") == "lz4k2m1xq7f3a"


def test_names_are_trimmed_and_bounded() -> None:
    assert check_name("  my job ") == "my job"
    with pytest.raises(InvalidArgument, match=r"^name: must be at most 200 characters"):
        check_name("n" * 201)


def test_submitted_fits_a_signed_64_bit_integer() -> None:
    assert check_submitted(2**63 - 1) == 2**63 - 1
    with pytest.raises(InvalidArgument, match=r"^submitted: "):
        check_submitted(2**63)


def test_daemon_hello_fields() -> None:
    assert check_daemon_id("node-1.example:4242") == "node-1.example:4242"
    with pytest.raises(InvalidArgument, match=r"^daemon_id: required$"):
        check_daemon_id("")
    with pytest.raises(InvalidArgument, match=r"^daemon_id: must be printable"):
        check_daemon_id("bad\nid")
    assert check_slots(1) == 1
    with pytest.raises(InvalidArgument, match=r"^slots: must be at least 1, got 0$"):
        check_slots(0)


def test_settings_get_their_defaults() -> None:
    settings = check_settings(common_pb2.JobSettings(), consumer_timeout=1800)
    assert settings == JobSettings()
    assert settings.max_attempts == 3 and settings.preemption is Preemption.GRACEFUL


def test_settings_are_converted() -> None:
    given = common_pb2.JobSettings(
        min_slots=2,
        max_slots=2,
        preemption=common_pb2.PREEMPTION_IMMEDIATE,
        task_timeout=1800,
        max_attempts=1,
        queue_type=common_pb2.QUEUE_TYPE_CLASSIC,
    )
    assert check_settings(given, consumer_timeout=1800) == JobSettings(
        min_slots=2,
        max_slots=2,
        preemption=Preemption.IMMEDIATE,
        task_timeout=1800.0,
        max_attempts=1,
        queue_type=QueueType.CLASSIC,
    )


@pytest.mark.parametrize(
    ("given", "field"),
    [
        (common_pb2.JobSettings(task_timeout=math.nan), "settings.task_timeout"),
        (common_pb2.JobSettings(task_timeout=math.inf), "settings.task_timeout"),
        (common_pb2.JobSettings(task_timeout=1800.5), "settings.task_timeout"),
        (common_pb2.JobSettings(min_slots=2_000_000), "settings.min_slots"),
        (common_pb2.JobSettings(max_slots=2_000_000), "settings.max_slots"),
        (common_pb2.JobSettings(min_slots=3, max_slots=2), "settings.max_slots"),
        (common_pb2.JobSettings(queue_type=9), "settings.queue_type"),  # type: ignore[arg-type]
        (common_pb2.JobSettings(preemption_grace=-1.0), "settings.preemption_grace"),
        (common_pb2.JobSettings(preemption_grace=math.nan), "settings.preemption_grace"),
        (
            common_pb2.JobSettings(preemption=common_pb2.PREEMPTION_IMMEDIATE, preemption_grace=5.0),
            "settings.preemption_grace",
        ),
    ],
)
def test_bad_settings_name_their_field(given: common_pb2.JobSettings, field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        check_settings(given, consumer_timeout=1800)


def test_priorities_need_a_classic_queue() -> None:
    given = common_pb2.JobSettings(priorities=True, queue_type=common_pb2.QUEUE_TYPE_CLASSIC)
    assert check_settings(given, consumer_timeout=1800).priorities
    with pytest.raises(InvalidArgument, match="^settings.priorities: needs queue_type classic"):
        check_settings(common_pb2.JobSettings(priorities=True), consumer_timeout=1800)


def test_frames_are_on_unless_the_job_sets_no_frames() -> None:
    assert check_settings(common_pb2.JobSettings(), consumer_timeout=1800).frames
    off = check_settings(common_pb2.JobSettings(no_frames=True), consumer_timeout=1800)
    assert off == JobSettings(frames=False)


def test_an_explicit_max_attempts_0_is_refused_not_turned_into_3() -> None:
    with pytest.raises(InvalidArgument, match="^settings.max_attempts: must be at least 1"):
        check_settings(common_pb2.JobSettings(max_attempts=0), consumer_timeout=1800)
    assert check_settings(common_pb2.JobSettings(), consumer_timeout=1800).max_attempts == 3


def test_an_explicit_max_slots_0_is_refused_and_unset_is_no_limit() -> None:
    with pytest.raises(InvalidArgument, match="^settings.max_slots: must be at least 1"):
        check_settings(common_pb2.JobSettings(max_slots=0), consumer_timeout=1800)
    assert check_settings(common_pb2.JobSettings(), consumer_timeout=1800).max_slots == 0


def test_an_unset_importance_says_it_is_required() -> None:
    with pytest.raises(
        InvalidArgument, match=r"^importance: required: a finite number > 0 \(got 0 or none\)"
    ):
        check_importance(0.0)


def test_retry_on_backoff_and_codec_are_checked_and_kept() -> None:
    given = common_pb2.JobSettings(retry_on=["TimeoutError", "a.b.Busy"], backoff_initial=0.5, codec="pickle")
    settings = check_settings(given, consumer_timeout=1800)
    assert settings.retry_on == ("TimeoutError", "a.b.Busy")
    assert (settings.backoff_initial, settings.backoff_max, settings.codec) == (0.5, 60.0, "pickle")


@pytest.mark.parametrize(
    ("given", "field"),
    [
        (common_pb2.JobSettings(retry_on=["not a name"]), "settings.retry_on"),
        (common_pb2.JobSettings(retry_on=[f"E{i}" for i in range(65)]), "settings.retry_on"),
        (common_pb2.JobSettings(backoff_initial=-1), "settings.backoff_initial"),
        (common_pb2.JobSettings(backoff_initial=5, backoff_max=1), "settings.backoff_max"),
        (common_pb2.JobSettings(backoff_max=math.inf), "settings.backoff_max"),
        (common_pb2.JobSettings(codec="json"), "settings.codec"),
    ],
)
def test_bad_retry_settings_name_their_field(given: common_pb2.JobSettings, field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        check_settings(given, consumer_timeout=1800)


def test_a_retry_backoff_longer_than_the_consumer_timeout_is_refused() -> None:
    given = common_pb2.JobSettings(
        retry_on=["TimeoutError"], backoff_initial=10, backoff_max=100, task_timeout=50
    )
    with pytest.raises(InvalidArgument, match="^settings.backoff_max: 100s .* consumer_timeout of 120s"):
        check_settings(given, consumer_timeout=120)
    assert check_settings(given, consumer_timeout=150).backoff_max == 100


def test_a_graceful_jobs_grace_is_kept_and_travels_to_daemons() -> None:
    given = common_pb2.JobSettings(preemption_grace=30.0)
    checked = check_settings(given, consumer_timeout=1800)
    assert (checked.preemption, checked.preemption_grace) == (Preemption.GRACEFUL, 30.0)
    assert settings_from_json(settings_json(checked)).preemption_grace == 30.0
    assert settings_pb(checked).preemption_grace == 30.0
    assert DaemonJobSettings.from_proto(settings_pb(checked)).preemption_grace == 30.0
    assert DaemonJobSettings.from_proto(common_pb2.JobSettings()).preemption_grace is None
