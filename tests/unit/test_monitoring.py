"""The ready-made monitoring files in docs/: the Prometheus alert rules pass promtool (their syntax
and their own unit tests, which fire each alert), and the Grafana dashboard parses and names only
metrics a real scheduler exports (as do the rules)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from truba.scheduler import Scheduler, SchedulerConfig

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "docs" / "prometheus" / "truba-rules.yml"
DASHBOARD = REPO / "docs" / "grafana" / "truba.json"
METRIC = re.compile(r"(?<![$\w])truba_[a-z0-9_]+")
"""A truba metric's name in PromQL (not a ``$truba_job`` dashboard variable)."""
NO_BROKER = "amqp://guest:guest@127.0.0.1:1/"
SAMPLES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/bootstrap installs it (apt-get install prometheus)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def test_the_alert_rules_pass_promtool_check_rules() -> None:
    checked = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout


def test_each_alert_fires_on_what_it_is_for_and_not_on_a_look_alike() -> None:
    # truba-rules.test.yml: a starved job against an idle one, a lost and a late daemon, no
    # daemon, the scheduler down, failing tasks, server-side gRPC errors against a client's
    tested = subprocess.run(
        [promtool(), "test", "rules", "truba-rules.test.yml"],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {
        rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    }
    tests = yaml.safe_load((RULES.parent / "truba-rules.test.yml").read_text())["tests"]
    fired = {
        case["alertname"] for test in tests for case in test["alert_rule_test"] if case.get("exp_alerts")
    }
    assert fired == alerts  # every alert has a case where it fires


def expressions(value: object) -> Iterator[str]:
    """Every PromQL expression in a dashboard: the targets' ``expr`` and the variables' queries."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("expr", "definition") and isinstance(item, str):
                yield item
            else:
                yield from expressions(item)
    elif isinstance(value, list):
        for item in value:
            yield from expressions(item)


@pytest.fixture
async def exported(tmp_path: Path) -> set[str]:
    """The names of the samples a real scheduler's /metrics has or would have (a family without
    series yet, e.g. per job before any job, still has its TYPE line)."""
    config = SchedulerConfig(
        brokers=["amqp://guest:guest@127.0.0.1:1/"],
        state_dir=tmp_path,
        listen="127.0.0.1:0",
        http="127.0.0.1:0",
    )
    async with Scheduler(config) as scheduler, aiohttp.ClientSession() as session:
        async with session.get(f"http://{scheduler.http_address}/metrics") as response:
            text = await response.text()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names |= {name, *(name + suffix for suffix in SAMPLES.get(kind, ()))}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    assert "truba_job_assigned_slots" in names and "truba_scheduler_plan_duration_seconds_bucket" in names
    return names


def test_the_grafana_dashboard_parses_and_each_panel_asks_prometheus_something() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for p in panels:
        assert p["title"] and p["description"], p["id"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
    titles = {p["title"] for p in panels}
    assert {"Slots held against fair share", "Throughput", "Backlog", "Busy slots per daemon"} <= titles


async def test_the_dashboard_and_the_rules_name_only_metrics_the_scheduler_exports(
    exported: set[str],
) -> None:
    named = {name for expr in expressions(json.loads(DASHBOARD.read_text())) for name in METRIC.findall(expr)}
    rules = yaml.safe_load(RULES.read_text())["groups"]
    named_by_rules = {name for g in rules for r in g["rules"] for name in METRIC.findall(r["expr"])}
    assert len(named) >= 15 and len(named_by_rules) >= 6
    assert named - exported == set()
    assert named_by_rules - exported == set()
