"""The simulator's burst decisions against the real daemon and slurmctld (issue 33): the
committed run of ``scripts/fidelity.py --burst`` (tests/data/fidelity-burst.json; how it
was made: docs/policy.md). Its figures are recomputed here from its per-job rows, and
held: the same place (cloud or on-prem) for at least 95 % of the jobs, and those jobs'
starts within one recheck plus the lab's boot timeout."""

from __future__ import annotations

import json

from tests.conftest import ROOT, script

RESULT = ROOT / "tests" / "data" / "fidelity-burst.json"


def test_the_committed_run_holds() -> None:
    doc = json.loads(RESULT.read_text())
    rows = doc["rows"]
    for r in rows:  # each row's verdict is its own data's
        assert r["same_place"] == ((r["partition"] != "onprem") == (r["sim_where"] != "onprem"))
    figures = script("fidelity").burst_figures(rows, doc["start_slack"])
    assert figures == {k: doc[k] for k in figures}  # the committed figures are the rows'
    assert doc["jobs"] >= 40 and 0 < doc["burst_lab"] < doc["jobs"]  # both kinds of decision
    assert doc["same_burst_decision"] >= 0.95
    assert doc["start_within_slack"] == 1.0
    assert doc["start_slack"] == doc["policy"]["recheck"] + 30  # the lab's boot_timeout
