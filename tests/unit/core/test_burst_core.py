"""Pure pieces of the burst path: resume files, host-key blocks, the node state machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_burst.core.cloud import AuthError, CapacityError, CloudError, ThrottledError, classify
from slurm_burst.core.nodestate import NodeState, TransitionError, check_transition, reason
from slurm_burst.core.resumefile import ResumeFileError, parse_resume_file

SLURM_22_05 = '{"jobs":[{"job_id":1,"nodes":"burst-[1-2]"}],"all_nodes":"burst-[1-2]"}'
SLURM_23_02 = json.dumps(
    {
        "all_nodes_resume": "gpu-[1-3]",
        "jobs": [
            {
                "job_id": 7,
                "nodes_alloc": "gpu-[1-4]",
                "nodes_resume": "gpu-[1-3]",
                "partition": "burst-gpu",
                "features": "a100",
                "extra": "sensitive=no",
                "oversubscribe": "OK",
                "reservation": None,
            }
        ],
    }
)


def test_resume_file_22_05_shape() -> None:
    info = parse_resume_file(SLURM_22_05)
    assert info.shape == "22.05" and info.all_nodes == "burst-[1-2]"
    assert [(j.job_id, j.nodes) for j in info.jobs] == [(1, "burst-[1-2]")]


def test_resume_file_23_02_shape_keeps_the_extra_fields() -> None:
    info = parse_resume_file(SLURM_23_02)
    assert info.shape == "23.02+" and info.all_nodes == "gpu-[1-3]"
    (j,) = info.jobs
    assert (j.job_id, j.nodes, j.partition, j.features) == (7, "gpu-[1-3]", "burst-gpu", "a100")
    assert j.extra["nodes_alloc"] == "gpu-[1-4]" and j.extra["extra"] == "sensitive=no"


@pytest.mark.parametrize(
    ("release", "job", "nodes", "extra"),
    [
        ("24.11", 3, "c-3", {"nodes_alloc": "c-3", "oversubscribe": "OK"}),
        # 26.05 adds "exclusive" and "priority"
        ("26.05", 1, "burst-cpu-[1-2]", {"exclusive": "NO", "priority": 1}),
    ],
)
def test_resume_files_recorded_from_live_releases(
    release: str, job: int, nodes: str, extra: dict[str, object]
) -> None:
    """The files each release's slurmctld handed our ResumeProgram (tests/data)."""
    data = Path(__file__).parents[2] / "data" / f"slurm-{release}"
    info = parse_resume_file((data / "resume-file.json").read_text())
    assert info.shape == "23.02+" and info.all_nodes == nodes
    (j,) = info.jobs
    assert (j.job_id, j.nodes) == (job, nodes)
    assert extra.items() <= j.extra.items()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not JSON"),
        ("[1]", "not an object"),
        ('{"jobs": []}', "no 'all_nodes'"),
        ('{"all_nodes": "a1", "jobs": {}}', "'jobs' is not a list"),
        ('{"all_nodes": "a1", "jobs": [{"job_id": "1", "nodes": "a1"}]}', "job_id"),
        ('{"all_nodes": "a1", "jobs": [{"job_id": 1, "nodes": 5}]}', "hostlist string"),
    ],
    ids=["empty", "list", "no-nodes", "jobs-dict", "job-id-string", "nodes-int"],
)
def test_resume_file_errors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ResumeFileError, match=message):
        parse_resume_file(text)


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        (None, NodeState.REQUESTED, True),
        (None, NodeState.TERMINATED, True),
        (None, NodeState.JOINED, False),
        (NodeState.REQUESTED, NodeState.LAUNCHING, True),
        (NodeState.LAUNCHING, NodeState.BOOTING, True),
        (NodeState.BOOTING, NodeState.BOOTSTRAPPING, True),
        (NodeState.BOOTSTRAPPING, NodeState.JOINED, True),
        (NodeState.JOINED, NodeState.TERMINATING, True),
        (NodeState.TERMINATING, NodeState.TERMINATED, True),
        (NodeState.TERMINATED, NodeState.REQUESTED, True),
        (NodeState.BOOTING, NodeState.FAILED, True),
        (NodeState.FAILED, NodeState.TERMINATING, True),
        (NodeState.REQUESTED, NodeState.JOINED, False),
        (NodeState.JOINED, NodeState.LAUNCHING, False),
        (NodeState.TERMINATED, NodeState.JOINED, False),
        (NodeState.FAILED, NodeState.JOINED, False),
    ],
    ids=lambda v: str(v),
)
def test_state_machine(old: NodeState | None, new: NodeState, ok: bool) -> None:
    if ok:
        check_transition(old, new)
    else:
        with pytest.raises(TransitionError):
            check_transition(old, new)


def test_reason_carries_the_code_and_stays_one_line() -> None:
    r = reason("BootTimeout", "instance i-1\nnot running\tafter 300 s " + "x" * 500)
    assert r.endswith("(Code:BootTimeout)") and "\n" not in r and len(r) < 260


@pytest.mark.parametrize(
    ("text", "cls", "code"),
    [
        ("InsufficientInstanceCapacity: no p4d", CapacityError, "InsufficientInstanceCapacity"),
        ("RequestLimitExceeded: slow down", ThrottledError, "RequestLimitExceeded"),
        ("UnauthorizedOperation: nope", AuthError, "UnauthorizedOperation"),
        ("something odd", CloudError, "CloudError"),
    ],
    ids=["capacity", "throttle", "auth", "other"],
)
def test_cloud_errors_keep_the_provider_code(text: str, cls: type, code: str) -> None:
    err = classify(text)
    assert type(err) is cls and err.code == code
