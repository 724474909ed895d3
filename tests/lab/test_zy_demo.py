"""`make demo` as the README shows it: ``scripts/demo.sh`` itself, run against the lab on
the release under test (``LAB_SLURM``), and what it prints checked: the job's two cloud
hostnames, a ledger row per instance, the chargeback total. The lab is up already (the
session's fixture): the script's own ``lab up`` finds it so, as a second ``make demo``
would. It runs last but the lab's removal (its instances stay in the ledger, and tests that
count the cloud's instances against the ledger's rows run before it)."""

from __future__ import annotations

import json
import re
import subprocess

from slurm_burst_lab.service import Lab

from tests.conftest import LAB_CONFIG, ROOT, invoke
from tests.lab.conftest import RELEASE, user_env


def section(out: str, title: str) -> str:
    """The lines the demo printed under its ``== title`` heading, to the next heading."""
    m = re.search(rf"^== {re.escape(title)}[^\n]*\n(.*?)(?=^== |\Z)", out, re.M | re.S)
    assert m, f"the demo printed no section {title!r}:\n{out}"
    return m.group(1)


def test_the_demo_runs_a_job_on_two_cloud_nodes_and_charges_it(lab: Lab) -> None:
    env = user_env(LAB_SLURM=RELEASE, COLUMNS="200", TERM="dumb", NO_COLOR="1")
    done = subprocess.run(
        ["scripts/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    out = done.stdout
    assert done.returncode == 0, f"demo.sh exited {done.returncode}\n{out}\n{done.stderr}"
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)  # its headings are bold on a terminal
    job = re.search(r"^submitted job (\d+);", out, re.M)
    assert job, out
    job_id = job.group(1)
    assert re.search(rf"^job {job_id}: COMPLETED after \d+ s$", out, re.M), out

    hosts = section(out, "job output").split()
    assert len(hosts) == 2 and len(set(hosts)) == 2, hosts
    assert all(re.fullmatch(r"burst-cpu-\d+", h) for h in hosts), hosts

    # the ledger's rows for the job's two instances, each printed with its instance id
    rows = json.loads(invoke(["--config", str(LAB_CONFIG), "ledger", "instances", "--json"]).stdout)
    mine = {r["node"]: r for r in rows if r["node"] in hosts and r["terminated"]}
    assert set(mine) == set(hosts), rows
    printed = section(out, "ledger: one row per instance")
    for node, row in mine.items():
        assert row["instance_id"] in printed and node in printed, (row, printed)

    # the chargeback: the job's row, its total as the report prints it
    report = json.loads(
        invoke([
            "--config", str(LAB_CONFIG), "ledger", "report", "--by", "job", "--json",
            "--from", "2000-01-01", "--to", "2100-01-01",
        ]).stdout
    )  # fmt: skip
    (row,) = [r for r in report["rows"] if r["job"] == job_id]
    assert row["total"] > 0, row
    charged = section(out, f"chargeback: job {job_id}")
    # the job's row: its first cell is the id (another job's row may hold the same digits,
    # as a percentage or a cost)
    line = next((ln for ln in charged.splitlines() if re.match(rf"\W*{job_id}\s", ln)), "")
    assert f"{row['total']:.6f}" in line, (row, charged)
