"""sinfo/squeue JSON parsing, keyed on the schema version (recorded from Slurm 22.05.8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_burst.adapters.slurm.openapi import SchemaError, parse_jobs, parse_nodes

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm-22.05"


def load(name: str) -> dict[str, object]:
    return dict(json.loads((DATA / name).read_text()))


def test_nodes_v0038() -> None:
    nodes = {n.name: n for n in parse_nodes(load("sinfo.json"))}
    assert len(nodes) == 7
    assert nodes["burst-cpu-1"].flags == {"CLOUD", "POWERED_DOWN"}
    assert nodes["burst-cpu-1"].sinfo_state == "mixed~"
    assert nodes["burst-gpu-2"].gres == "gpu:simgpu:2"
    assert nodes["onprem-1"].addr == "10.250.0.2" and nodes["onprem-1"].boot_time is not None
    assert nodes["burst-cpu-3"].boot_time is None


def test_jobs_v0038() -> None:
    jobs = {j.job_id: j for j in parse_jobs(load("squeue.json"))}
    burst = jobs[2]
    assert burst.partition == "burst-cpu" and burst.nodes == "burst-cpu-[1-2]"
    assert burst.state == "CONFIGURING" and burst.time_limit_min == 60
    assert burst.tres_requested == {"cpu": "2", "mem": "2000M", "node": "2", "billing": "2"}
    assert jobs[1].time_limit_min is None  # partition MaxTime=UNLIMITED


def test_unknown_schema_is_an_explicit_error() -> None:
    doc = load("sinfo.json")
    doc["meta"] = {"plugin": {"type": "openapi/v0.0.99"}}
    with pytest.raises(SchemaError, match=r"v0\.0\.99 is not supported"):
        parse_nodes(doc)


def test_misshapen_document_is_a_schema_error() -> None:
    doc = load("squeue.json")
    del doc["jobs"][0]["job_id"]  # type: ignore[index]
    with pytest.raises(SchemaError, match=r"not shaped as v0\.0\.38"):
        parse_jobs(doc)
    with pytest.raises(SchemaError, match=r"no meta\.plugin\.type"):
        parse_nodes({"nodes": []})
