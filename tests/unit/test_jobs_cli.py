"""``slurm-burst jobs``: the burst policy's last pass from the state database, as a
table and as JSON, filtered by verdict; exit 1 when the policy is off or has not run."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_burst.adapters.state.store import Store
from tests.conftest import invoke
from tests.unit.test_config import GOOD, write

DOC = {
    "at": 1_790_000_000.0, "seconds": 0.01, "pending": 3, "eligible": 2, "decided": 2,
    "verdicts": {"burst": 1, "wait": 1}, "steered": 1, "slurm_calls": 2, "error": "",
    "complaints": ["Job is no longer pending execution for job 9"],
    "totals": {"burst": 1, "wait": 1},
    "jobs": [
        {"job": "41", "verdict": "burst", "reason": "expected on-prem wait 2.0 h > 10 min; "
         "cloud $0.37", "group": "cpu", "cost": 0.37, "look_again": None},
        {"job": "42", "verdict": "wait", "reason": "expected on-prem wait 5 min <= 10 min",
         "group": None, "cost": None, "look_again": 1_790_000_300.0},
    ],
}  # fmt: skip


def _config(tmp_path: Path, enabled: bool) -> Path:
    state = tmp_path / "state"
    text = GOOD + f"\n[policy]\nenabled = {'true' if enabled else 'false'}\n"
    if "[daemon]" in GOOD:
        text = text.replace("[daemon]", f'[daemon]\nstate_dir = "{state}"', 1)
    else:
        text += f'\n[daemon]\nstate_dir = "{state}"\n'
    return write(tmp_path, text)


def test_the_last_pass_as_a_table_and_as_json(tmp_path: Path) -> None:
    cfg = _config(tmp_path, True)
    Store(tmp_path / "state" / "state.db").set_policy_report(DOC)
    table = invoke(["--config", str(cfg), "jobs"]).stdout
    assert "3 pending, 2 may burst, 2 decided, 1 sent" in table
    assert "! slurm: Job is no longer pending execution for job 9" in table
    assert "41" in table and "$0.37" in table and "5 min <= 10 min" in table
    doc = json.loads(invoke(["--config", str(cfg), "jobs", "--json", "--verdict", "wait"]).stdout)
    assert doc["enabled"] and [r["job"] for r in doc["jobs"]] == ["42"]
    assert doc["last_pass"]["steered"] == 1 and "jobs" not in doc["last_pass"]


def test_off_or_not_run_yet_is_exit_1(tmp_path: Path) -> None:
    off = _config(tmp_path, False)
    Store(tmp_path / "state" / "state.db")
    r = invoke(["--config", str(off), "jobs"], expect=1)
    assert "the burst policy is off (policy.enabled)" in r.stdout
    on = _config(tmp_path, True)
    r = invoke(["--config", str(on), "jobs", "--json"], expect=1)
    assert json.loads(r.stdout) == {"enabled": True, "last_pass": None, "jobs": []}
