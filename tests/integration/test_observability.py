"""The shipped alert rules, Alertmanager example and dashboard, checked with the real
tools: promtool (check and unit-test the rules), amtool (check the routing), a real
Alertmanager (routes and inhibitions), and the daemon's own registry (every metric a
rule or a panel names exists). The lab runs the queries against a real Prometheus
(tests/lab/test_x_observability.py)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_burst.adapters.metrics.prom import Metrics

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "slurm-conf" / "prometheus"
RULES = PROM / "slurm-burst.rules.yml"
ALERTMANAGER = PROM / "alertmanager.yml"
DASHBOARD = ROOT / "slurm-conf" / "grafana" / "slurm-burst.json"
DOCS = ROOT / "docs" / "observability.md"

needs = pytest.mark.skipif(
    not (shutil.which("promtool") and shutil.which("amtool")),
    reason="promtool and amtool come with Debian's prometheus packages (make setup)",
)


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=PROM)


@needs
def test_promtool_checks_the_rules() -> None:
    out = run("promtool", "check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


@needs
def test_promtool_unit_tests_pass_and_cover_every_alert() -> None:
    out = run("promtool", "test", "rules", "tests/alerts.test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    tests = yaml.safe_load((PROM / "tests" / "alerts.test.yml").read_text())["tests"]
    firing = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert firing == {a["alert"] for a in alerts()}  # each one seen firing at least once


def test_every_alert_has_a_severity_a_summary_and_a_runbook() -> None:
    docs = DOCS.read_text()
    for a in alerts():
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a["alert"]
        assert {"summary", "description", "runbook"} <= set(a["annotations"]), a["alert"]
        assert f"\n### {a['alert']}\n" in docs, f"{a['alert']}: no runbook in {DOCS.name}"


def known_metrics() -> set[str]:
    """Every series name the daemon can export (histograms' and counters' too)."""
    text = Metrics().text().decode()
    names = set()
    for line in text.splitlines():
        m = re.match(r"# TYPE (\w+) (\w+)", line)
        if m:
            name, kind = m.groups()
            names.add(name)
            if kind == "counter":
                names.add(name + "_total")
            if kind == "histogram":
                names |= {name + s for s in ("_bucket", "_count", "_sum")}
    return names


def named_metrics(text: str) -> set[str]:
    return set(re.findall(r"\bslurm_burst_\w+", text))


def dashboard_queries() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p["targets"]]


def test_rules_and_dashboard_name_only_metrics_the_daemon_exports() -> None:
    known = known_metrics()
    rules = named_metrics(RULES.read_text())
    panels = named_metrics(" ".join(dashboard_queries()))
    assert rules - known == set()
    assert panels - known == set()
    assert len(panels) >= 15  # the dashboard covers the families, not a few


def test_the_dashboard_is_a_grafana_model_with_a_datasource_variable() -> None:
    d = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24


@needs
def test_amtool_accepts_the_alertmanager_example_and_routes_by_severity() -> None:
    out = run("amtool", "check-config", str(ALERTMANAGER))
    assert out.returncode == 0, out.stdout + out.stderr
    for severity, receiver in (
        ("critical", "hpc-oncall-pager"),
        ("warning", "hpc-admins"),
        ("info", "hpc-info"),
    ):
        out = run("amtool", "config", "routes", "test", f"--config.file={ALERTMANAGER}",
                  "alertname=SlurmBurstGroupProtected", f"severity={severity}")  # fmt: skip
        assert out.stdout.split() == [receiver], out.stdout + out.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.skip("Debian's prometheus-alertmanager is not installed (make setup)")
    listen = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [binary, f"--config.file={ALERTMANAGER}", f"--storage.path={tmp_path}",
         f"--web.listen-address={listen}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{listen}/-/ready", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("Alertmanager did not become ready")
                time.sleep(0.2)
        yield listen
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_real_alertmanager_inhibits_symptoms_while_their_cause_fires(alertmanager: str) -> None:
    def alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, "severity": severity, **labels},
                "annotations": {"summary": name}}  # fmt: skip

    sent = [
        alert("SlurmBurstNoLeader", "critical"),
        alert("SlurmBurstReconcileStalled", "critical", instance="a:9466", job="slurm-burst"),
        alert("SlurmBurstGroupProtected", "critical", group="gpu"),
        alert("SlurmBurstLaunchFailureRate", "warning", group="gpu"),
        alert("SlurmBurstLaunchFailureRate", "warning", group="cpu"),
        alert("SlurmBurstBudgetExhausted", "info", account="medgen"),
        alert("SlurmBurstBudgetOnCourseToRunOut", "warning", account="physics"),
    ]
    req = urllib.request.Request(
        f"http://{alertmanager}/api/v2/alerts", data=json.dumps(sent).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    urllib.request.urlopen(req, timeout=10).close()

    def states() -> dict[tuple[str, str], str]:
        with urllib.request.urlopen(f"http://{alertmanager}/api/v2/alerts", timeout=10) as r:
            got = json.loads(r.read())
        return {
            (a["labels"]["alertname"], a["labels"].get("group") or a["labels"].get("account", "")):
            a["status"]["state"] for a in got
        }  # fmt: skip

    deadline = time.monotonic() + 20
    want = {
        ("SlurmBurstNoLeader", ""): "active",
        ("SlurmBurstReconcileStalled", ""): "suppressed",  # no leader: its symptom
        ("SlurmBurstGroupProtected", "gpu"): "active",
        ("SlurmBurstLaunchFailureRate", "gpu"): "suppressed",  # its group is protected
        ("SlurmBurstLaunchFailureRate", "cpu"): "active",  # cpu is not
        ("SlurmBurstBudgetExhausted", "medgen"): "active",
        ("SlurmBurstBudgetOnCourseToRunOut", "physics"): "active",  # another account
    }
    while (got := states()) != want and time.monotonic() < deadline:
        time.sleep(0.3)  # inhibition is worked out as the alerts arrive
    assert got == want


SLURM_2605 = ROOT / "tests" / "data" / "slurm-26.05"


def test_rules_and_dashboard_name_only_series_slurmctld_serves() -> None:
    """Slurm's own series the dashboard and the rules use are among those 26.05's
    slurmctld served in the lab (its four endpoints, recorded in tests/data)."""
    served = set()
    for path in sorted(SLURM_2605.glob("metrics-*.txt")):
        served |= set(re.findall(r"^# TYPE (\w+) ", path.read_text(), re.M))
    assert len(served) > 50, served  # the four endpoints, recorded
    used = set(
        re.findall(r"\bslurm_(?!burst_)\w+", RULES.read_text() + " ".join(dashboard_queries()))
    )
    assert used, "the dashboard uses slurmctld's own series"
    assert used - served == set()
