"""What the SDK prints unasked: one-line notices on stderr when the application configured no
logging (a log record otherwise), and no aio-pika/aiormq records above debug."""

from __future__ import annotations

import logging

import pytest

import truba.pipes.rabbit  # noqa: F401  (lowers aio-pika's and aiormq's records to debug)
from truba.client.notices import notice


def test_a_notice_is_one_stderr_line_when_no_logging_is_configured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    isolated = logging.getLogger("truba.client.test_isolated")
    isolated.propagate = False  # no handler above it either: as in a script that configured nothing
    notice(isolated, "client.test.event", "job 1 keeps running", job_id="1")
    assert capsys.readouterr().err == "truba: job 1 keeps running\n"


def test_a_notice_is_a_record_with_fields_when_logging_is_configured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="truba.client")
    notice(logging.getLogger("truba.client.test"), "client.test.event", "job 1 keeps running", job_id="1")
    (record,) = caplog.records
    assert record.getMessage() == "client.test.event" and record.levelno == logging.WARNING
    assert (record.job_id, record.text) == ("1", "job 1 keeps running")  # type: ignore[attr-defined]


def test_aiormq_errors_of_expected_faults_are_kept_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    logging.getLogger("aiormq.connection").error("error when creating transport: %r", OSError(111))
    (record,) = [r for r in caplog.records if r.name == "aiormq.connection"]
    assert record.levelno == logging.DEBUG
