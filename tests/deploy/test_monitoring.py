"""deploy/prometheus-rules.yml and deploy/grafana-dashboard.json watch metrics that exist.

A renamed metric leaves an alert that never fires and a panel that stays
empty, and nothing says so. Here every ``edgegw_*`` name in the rules and the
dashboard must be in the ``/metrics`` of real gateways (two regions mirroring
each other, so the mirror families are there too); promtool checks the rules'
syntax and runs their unit tests (deploy/prometheus-rules.test.yml: each alert
fires on the series it is meant for, and not on a healthy gateway).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml
from _serve import Fleet, TopicSpec

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"

_METRIC = re.compile(r"\bedgegw_[a-z0-9_]+")


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: apt-get install prometheus (make pytest installs it)"
    return path


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dash["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def _exposed_names(text: str) -> set[str]:
    """Every family (``# TYPE`` lines: also those with no sample now, such as
    ``edgegw_bucket_denied`` or ``edgegw_journal_dropped_records_total``) and
    every sample name in an exposition."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names.add(name)
            if kind == "counter":  # its samples, when it has some: <name>_total
                names.add(f"{name}_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_the_rules_cover_what_an_operator_must_hear_about() -> None:
    rules = _rules()
    by_name = {r["alert"]: r for r in rules}
    assert len(by_name) == len(rules), "two alerts share a name"
    for name in (
        "EdgegwDown",
        "EdgegwFenced",
        "EdgegwMirrorLag",
        "EdgegwMirrorQuarantined",
        "EdgegwJournalNearFull",
        "EdgegwJournalDamaged",
        "EdgegwStateFileDamaged",
        "EdgegwJournalEntriesLost",
        "EdgegwJournalRepaired",
        "EdgegwLinkAllowance",
        "EdgegwLinkAllowanceUsed",
        "EdgegwBucketDenied",
        "EdgegwTaskDegraded",
    ):
        assert name in by_name, f"no {name} alert"
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
    assert 'job="edgegw"' in by_name["EdgegwDown"]["expr"]


def test_every_metric_in_the_rules_and_the_dashboard_is_exposed(tmp_path: Path) -> None:
    wanted: dict[str, set[str]] = {}
    for rule in _rules():
        for name in _METRIC.findall(rule["expr"]):
            wanted.setdefault(name, set()).add(f"alert {rule['alert']}")
    for expr in _dashboard_exprs():
        for name in _METRIC.findall(expr):
            wanted.setdefault(name, set()).add("dashboard")
    assert len(wanted) >= 15, sorted(wanted)

    fleet = Fleet(
        tmp_path,
        ["north", "south"],
        [TopicSpec("t", "north", 2), TopicSpec("u", "south", 2)],
        # The allowance families are there when an allowance is set.
        per_region={"north": {"link": {"daily_bytes": "1GiB", "monthly_bytes": "30GiB"}}},
    )
    try:
        fleet.start()
        exposed: set[str] = set()
        for region in ("north", "south"):
            scrape = httpx.get(f"{fleet[region].url}/metrics", timeout=30)
            scrape.raise_for_status()
            exposed |= _exposed_names(scrape.text)
    finally:
        codes = fleet.close()
    assert codes == {"north": 0, "south": 0}
    assert "edgegw_mirror_lag_seconds" in exposed  # the fleet does mirror
    missing = {name: sorted(where) for name, where in wanted.items() if name not in exposed}
    assert not missing, f"not in any gateway's /metrics: {missing}"


def test_the_dashboard_is_grafana_json_with_a_query_per_panel() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"]
    assert dash["title"]
    assert dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("intake", "journal", "shipped", "unshipped", "mirror lag", "disk", "link"):
        assert topic in titles, f"no panel about {topic}"
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert _METRIC.search(target["expr"]), (panel["title"], target["expr"])
        grid = panel["gridPos"]
        assert grid["w"] > 0
        assert grid["h"] > 0
        assert grid["x"] + grid["w"] <= 24
