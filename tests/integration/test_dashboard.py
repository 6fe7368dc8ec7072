"""The dashboard in a real browser (Debian's headless Chromium) against a running cluster: the page
loads with no console error, shows a job's live numbers and outcome latency, its page with its
timeline, and a failing job's page with its failed attempts and dead letters; a screenshot of
each view is saved to ``$TRUBA_ARTIFACTS`` (default ``.artifacts/``)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TypeVar, cast

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

import truba
from tests.integration.processes import Cluster
from truba.client import Outcome

pytestmark = pytest.mark.integration

HTTP_LINE = re.compile(r"^truba scheduler http on (http://\S+/)$", re.MULTILINE)
ARTIFACTS = Path(os.environ.get("TRUBA_ARTIFACTS", ".artifacts"))
T = TypeVar("T")


def browser_paths() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        if os.environ.get("CI"):
            pytest.fail("chromium or chromedriver is missing: scripts/bootstrap installs them")
        pytest.skip("chromium and chromium-driver are not installed")
    return chromium, driver


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1366,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    chrome.set_page_load_timeout(20)
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture
def cluster(rabbit_nodes: list[object], tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, rabbit_nodes)
    try:
        running.start()
        yield running
    except BaseException:
        print(running.logs())
        raise
    finally:
        running.local.stop()


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 15.0) -> T:
    """``probe()``'s first truthy answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = probe()
        except (NoSuchElementException, StaleElementReferenceException):
            answer = None
        if answer:
            return answer
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def cell(browser: webdriver.Chrome, row: str, column: str) -> str:
    text: str = browser.find_element(By.CSS_SELECTOR, f"#{row} td.{column}").text
    return text


def severe(browser: webdriver.Chrome) -> list[str]:
    entries: list[dict[str, str]] = browser.get_log("browser")  # type: ignore[no-untyped-call]
    return [entry["message"] for entry in entries if entry["level"] == "SEVERE"]


def test_the_dashboard_shows_a_running_job_live_and_its_page(
    cluster: Cluster, browser: webdriver.Chrome
) -> None:
    found = HTTP_LINE.search(cluster.local.processes[0].log())
    assert found, "the scheduler printed no http line"
    base = found.group(1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with truba.connect(cluster.address) as client:
        job = client.create_job(handler="tests.handlers.basic:sleep", name="naps")
        for _ in range(300):
            job.submit(0.05)  # about 4 s on 4 slots: the page sees them run, even on a busy machine
        schedule = client.create_schedule("tests.handlers.basic:square", every=0.5, payload=3, name="ticks")
        # A job whose first task fails and whose second kills its slot on its only attempt (given up)
        faults = client.create_job(handler="tests.handlers.basic:behave", name="faults", max_attempts=1)
        failing = faults.submit(["raise", "the dashboard shows this"])
        dead = faults.submit(["exit", 3])
        browser.get(base)
        row = f"job-{job.id}"
        eventually(lambda: browser.find_element(By.ID, row), "the job's row")
        first = int(cell(browser, row, "done").replace(",", "") or 0)
        # Live: the done count moves on its own while tasks run.
        eventually(lambda: int(cell(browser, row, "done").replace(",", "") or 0) > first, "done to grow")
        eventually(lambda: browser.find_elements(By.CSS_SELECTOR, "#daemon-d0, #daemon-d1"), "daemons")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#daemons tbody tr")) == 2
        # Schedules: a row per schedule, its runs counted live, the last one's outcome
        ticks = f"schedule-{schedule.id}"
        eventually(lambda: browser.find_element(By.ID, ticks), "the schedule's row")
        runs = int(cell(browser, ticks, "runs").replace(",", "") or 0)
        eventually(lambda: int(cell(browser, ticks, "runs").replace(",", "") or 0) > runs, "runs to grow")
        eventually(lambda: cell(browser, ticks, "outcome") == "ok", "an ok run")
        eventually(lambda: browser.find_elements(By.CSS_SELECTOR, "#chart-rate path"), "a throughput line")
        # Outcomes taken: the client reports their latency, drawn per job
        results = cast(Generator[Outcome, None, None], job.results())
        for _ in range(40):
            assert next(results).ok
        eventually(lambda: browser.find_elements(By.CSS_SELECTOR, "#chart-latency path"), "a latency line")
        browser.save_screenshot(str(ARTIFACTS / "dashboard-overview.png"))
        browser.find_element(By.LINK_TEXT, job.id).click()
        eventually(lambda: browser.find_element(By.ID, "job-title").text.startswith(job.id), "the job page")
        assert browser.find_element(By.ID, "fact-handler").text == "tests.handlers.basic:sleep"
        eventually(lambda: browser.find_elements(By.CSS_SELECTOR, "#job-backlog path"), "the job's charts")
        eventually(lambda: browser.find_elements(By.CSS_SELECTOR, "#job-latency path"), "its latency chart")
        latency = browser.find_element(By.ID, "fact-outcome-latency-p50-p99").text
        assert re.fullmatch(r"[\d.,]+ m?s / [\d.,]+ m?s", latency), latency
        # The timeline: a bar per task attempt on the daemons' slot lanes, live, with its legend
        bars = eventually(
            lambda: browser.find_elements(By.CSS_SELECTOR, "#job-timeline rect.tl-span.tl-ok"),
            "timeline bars",
        )
        drawn = len(bars)
        for _ in range(20):  # more attempts: they appear without a reload
            job.submit(0.05)
        eventually(
            lambda: len(browser.find_elements(By.CSS_SELECTOR, "#job-timeline rect.tl-span")) > drawn,
            "the timeline to grow",
        )
        lanes = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "#job-timeline .tl-lane")}
        assert lanes and all(lane.startswith(("d0 · slot", "d1 · slot")) for lane in lanes), lanes
        assert (
            "preempted (put back)" in browser.find_element(By.CSS_SELECTOR, "#job-timeline .tl-legend").text
        )
        browser.save_screenshot(str(ARTIFACTS / "dashboard-job.png"))
        for _ in range(280):
            assert next(results).ok
        results.close()
        job.close()
        schedule.delete()
        # The failing job's page: its failed attempt with its error, its dead letter
        browser.get(f"{base}#job/{faults.id}")
        error_row = eventually(
            lambda: [
                r.text
                for r in browser.find_elements(By.CSS_SELECTOR, "#job-errors tbody tr")
                if failing in r.text
            ],
            "the failed attempt",
        )[0]
        assert "ValueError: the dashboard shows this" in error_row and (
            "d0 ·" in error_row or "d1 ·" in error_row
        )
        dead_row = eventually(
            lambda: [
                r.text for r in browser.find_elements(By.CSS_SELECTOR, "#job-dead tbody tr") if dead in r.text
            ],
            "the dead letter",
            timeout=30.0,
        )[0]
        assert "gave up" in dead_row and "SlotDied" in dead_row, dead_row
        browser.execute_script("document.getElementById('job-errors').scrollIntoView()")
        browser.save_screenshot(str(ARTIFACTS / "dashboard-job-faults.png"))
        faults.close()
        outcomes = {o.task_id: o for o in faults.results()}
        assert not outcomes[failing].ok and outcomes[dead].gave_up
    assert severe(browser) == [], "the page logged errors"
    assert (ARTIFACTS / "dashboard-job.png").stat().st_size > 10_000
    assert (ARTIFACTS / "dashboard-job-faults.png").stat().st_size > 10_000
