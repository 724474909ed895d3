"""sinfo/squeue JSON parsing, keyed on the schema version (recorded from Slurm 22.05.8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.adapters.slurm.openapi import SchemaError, parse_jobs, parse_nodes

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm-22.05"
DATA_2411 = DATA.parent / "slurm-24.11"
DATA_2605 = DATA.parent / "slurm-26.05"


def load(name: str, data: Path = DATA) -> dict[str, object]:
    return dict(json.loads((data / name).read_text()))


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
    with pytest.raises(SchemaError, match=r"no meta\.plugin"):
        parse_nodes({"nodes": []})


def test_nodes_v0042_from_scontrol_of_slurm_24_11() -> None:
    nodes = {n.name: n for n in parse_nodes(load("scontrol-nodes.json", DATA_2411))}
    assert sorted(nodes) == ["c-1", "c-2", "c-3", "c-4"]  # onprem-1 (unresolvable) not listed
    up = nodes["c-1"]
    assert up.state == "mixed" and up.flags == {"CLOUD", "NOT_RESPONDING", "POWERING_UP"}
    assert up.partitions == ("burst",) and up.features == ("cloud",)
    assert up.cpus == 2 and up.real_memory_mb == 1000 and up.boot_time is None
    assert nodes["c-4"].flags == {"CLOUD", "DRAIN", "POWERED_DOWN"}
    assert nodes["c-4"].reason == "probe (Code:Test)"


def test_jobs_v0042_from_squeue_of_slurm_24_11() -> None:
    jobs = {j.job_id: j for j in parse_jobs(load("squeue.json", DATA_2411))}
    burst = jobs[1]
    assert burst.state == "CONFIGURING" and burst.nodes == "c-[1-2]"  # as 22.05 says it
    assert burst.node_count == 2 and burst.cpus == 2 and burst.time_limit_min == 60
    assert burst.tres_requested == {"cpu": "2", "mem": "2000M", "node": "2", "billing": "2"}
    assert burst.submit_time is not None and burst.user == "root"
    assert jobs[2].state == "PENDING" and jobs[2].reason == "Resources"
    assert jobs[2].start_time is None


def test_sinfo_of_24_11_groups_nodes_and_says_so() -> None:
    """24.11's sinfo --json has no per-node records: a clear error naming its schema."""
    with pytest.raises(SchemaError, match=r"not shaped as v0\.0\.42"):
        parse_nodes(load("sinfo.json", DATA_2411))


def test_an_unknown_schema_names_the_slurm_release() -> None:
    doc = load("squeue.json", DATA_2411)
    doc["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.44"  # type: ignore[index]
    doc["meta"]["slurm"]["release"] = "26.05.5"  # type: ignore[index]
    with pytest.raises(SchemaError, match=r"Slurm 26\.05\.5's JSON schema v0\.0\.44 is not"):
        parse_jobs(doc)


def test_slurm_26_05_v0045_nodes_jobs_and_oneliners() -> None:
    """Recorded from sid's 26.05.5 (tests/data/slurm-26.05): the v0.0.42 shape again."""
    from slurm_burst.adapters.slurm.cli import parse_oneliners

    nodes = {n.name: n for n in parse_nodes(load("scontrol-nodes.json", DATA_2605))}
    assert len(nodes) == 37 and nodes["burst-cpu-1"].sinfo_state == "idle~"
    assert (
        nodes["burst-gpu-2"].reason == "probe (Code:Test)" and "DRAIN" in nodes["burst-gpu-2"].flags
    )
    assert nodes["burst-cpu-1"].partitions == ("burst-cpu",) and nodes["burst-cpu-1"].cpus == 2
    (job,) = parse_jobs(load("squeue.json", DATA_2605))
    assert (job.state, job.partition, job.node_count, job.reason) == (
        "PENDING", "burst-cpu", 2, "JobHeldUser",
    )  # fmt: skip
    with pytest.raises(SchemaError, match=r"not shaped as v0\.0\.45"):
        parse_nodes(load("sinfo.json", DATA_2605))  # grouped by state, as 24.11's
    text = (DATA_2605 / "nodes.txt").read_text()
    assert not any(n.registered for n in parse_oneliners(text).values() if n.name != "onprem-1")


def test_the_cli_reads_24_11_nodes_from_scontrol_after_one_look_at_sinfo() -> None:
    """Recorded 24.11 answers behind the CLI adapter's runner: the first read asks sinfo,
    sees its grouped shape, and asks scontrol; later reads ask scontrol only."""
    from slurm_burst.adapters.proc import Result
    from slurm_burst.adapters.slurm.cli import SlurmCli

    asked: list[tuple[str, ...]] = []
    answers = {"sinfo": "sinfo.json", "scontrol": "scontrol-nodes.json"}

    def runner(argv: list[str], timeout: float, env: object) -> Result:
        tool = Path(argv[0]).name
        asked.append((tool, *argv[1:]))
        return Result(tuple(argv), 0, (DATA_2411 / answers[tool]).read_text(), "", 0.0)

    cli = SlurmCli(runner=runner)
    assert len(cli.nodes()) == 4 and len(cli.nodes()) == 4
    assert asked == [
        ("sinfo", "--json"),
        ("scontrol", "show", "nodes", "--json"),
        ("scontrol", "show", "nodes", "--json"),
    ]


@pytest.mark.parametrize("data", [DATA_2411, DATA_2605], ids=["24.11", "26.05"])
def test_sacct_of_24_11_and_26_05_gives_the_finished_job(data: Path) -> None:
    """Recorded from a job that ran on the on-prem node of each release's check cluster;
    their state is a list (22.05: a string), which once made every job look unfinished."""
    from slurm_burst.adapters.slurm.accounting import parse_job

    jobs: list[dict[str, Any]] = load("sacct.json", data)["jobs"]  # type: ignore[assignment]
    assert len(jobs) == 1
    job = parse_job(jobs[0], "burstlab")
    assert job is not None
    assert (job.job_id, job.state, job.partition, job.nodes) == (
        1,
        "COMPLETED",
        "onprem",
        "onprem-1",
    )
    assert (job.cpus, job.node_count, job.account) == (1, 1, "root")
    assert job.end >= job.start


def test_a_requeued_lifes_record_of_24_11_is_a_finished_requeued_one() -> None:
    """sacct --duplicates of 24.11 and 26.05 gives a job requeued after a reclaim two
    records: the first life's state is ["PENDING", "REQUEUED"] (22.05: "REQUEUED"); it
    ran and is charged, not skipped as pending (seen in make demo-training on 24.11)."""
    from slurm_burst.adapters.slurm.accounting import parse_job

    raw: dict[str, Any] = load("sacct.json", DATA_2411)["jobs"][0]  # type: ignore[index]
    first = {**raw, "state": {"current": ["PENDING", "REQUEUED"], "reason": "BurstBufferStageIn"}}
    job = parse_job(first, "burstlab")
    assert job is not None and job.state == "REQUEUED", job
    pending = {**raw, "state": {"current": ["PENDING"], "reason": "None"}}
    assert parse_job(pending, "burstlab") is None
