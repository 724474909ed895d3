"""Which placement groups may go, and how a launch is cut into calls by job."""

from __future__ import annotations

import json

import pytest

from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.placement import unheld
from slurm_burst.core.records import NodeRecord
from slurm_burst.services.launcher import launch_chunks

pytestmark = pytest.mark.unit


def rec(name: str, state: NodeState = NodeState.BOOTING, placement: str = "",
        jobs: tuple[int, ...] = ()) -> NodeRecord:  # fmt: skip
    listed = [{"job_id": j, "nodes": name} for j in jobs]
    return NodeRecord(name, "g", state, Want.UP, placement=placement, jobs=json.dumps(listed))


@pytest.mark.parametrize(
    ("records", "gone"),
    [
        ([], ["pg-a", "pg-b"]),
        ([rec("n1", placement="pg-a")], ["pg-b"]),
        ([rec("n1", NodeState.TERMINATED, "pg-a")], ["pg-a", "pg-b"]),
        ([rec("n1", NodeState.LAUNCHING, "pg-a"), rec("n2", NodeState.FAILED, "pg-b")], []),
        ([rec("n1", NodeState.JOINED, "pg-c")], ["pg-a", "pg-b"]),
    ],
    ids=["none-held", "one-held", "terminated-holds-nothing", "launching-and-failed-hold",
         "unknown-group-ignored"],
)  # fmt: skip
def test_a_placement_group_goes_once_no_live_node_holds_it(
    records: list[NodeRecord], gone: list[str]
) -> None:
    made = {"pg-a": "aws", "pg-b": "aws"}
    assert [name for name, _ in unheld(made, records)] == gone


def test_launch_chunks_put_each_multi_node_job_in_calls_of_its_own() -> None:
    recs = [rec("a1", jobs=(7,)), rec("b1", jobs=(8,)), rec("a2", jobs=(7,)),
            rec("c1", jobs=(9,)), rec("x"), rec("a3", jobs=(7,))]  # fmt: skip
    chunks = [[r.name for r in c] for c in launch_chunks(recs, 500, by_job=True)]
    assert chunks == [["a1", "a2", "a3"], ["x", "b1", "c1"]]
    assert [[r.name for r in c] for c in launch_chunks(recs, 2, by_job=True)] == [
        ["a1", "a2"], ["a3"], ["x", "b1"], ["c1"]]  # fmt: skip
    assert [len(c) for c in launch_chunks(recs, 4)] == [4, 2]  # no placement: by count
