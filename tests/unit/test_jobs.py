"""Which nodes serve which jobs, how a partial launch is shared out, and which nodes a
failed node takes down with it (core.jobs, pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_burst.core.jobs import (
    jobs_by_node,
    least_useful,
    nodes_by_job,
    released_with,
    share_out,
)


def test_each_node_keeps_only_the_jobs_that_list_it() -> None:
    jobs = [
        {"job_id": 1, "nodes": "n[1-2]"},
        {"job_id": 2, "nodes": "n3"},
        {"job_id": 3, "nodes": "n[1-999]"},  # more nodes than the request: not ours
        {"job_id": 4, "nodes": "n[1-"},  # does not parse
    ]
    assert nodes_by_job(jobs) == {1: ["n1", "n2"], 2: ["n3"], 3: [f"n{i}" for i in range(1, 1000)]}
    got = jobs_by_node(jobs, ["n1", "n2", "n3"])
    assert {n: [j["job_id"] for j in js] for n, js in got.items()} == {
        "n1": [1], "n2": [1], "n3": [2],
    }  # fmt: skip


JOBS_3_5_8 = {
    **{f"a{i}": {1} for i in range(3)},
    **{f"b{i}": {2} for i in range(5)},
    **{f"c{i}": {3} for i in range(8)},
}
NODES = list(JOBS_3_5_8)


def test_a_partial_launch_serves_whole_jobs_first_then_the_first_job_left() -> None:
    assert share_out(NODES, JOBS_3_5_8, 16) == NODES
    assert share_out(NODES, JOBS_3_5_8, 11) == [*NODES[:8], "c0", "c1", "c2"]  # a, b whole
    assert share_out(NODES, JOBS_3_5_8, 7) == [*NODES[:3], "b0", "b1", "b2", "b3"]
    assert least_useful(NODES, JOBS_3_5_8) == 3
    big_first = NODES[8:] + NODES[:3]  # c (8) does not fit in 4: a (3) whole, then c0
    assert share_out(big_first, JOBS_3_5_8, 4) == ["c0", "a0", "a1", "a2"]


def test_nodes_sharing_a_job_transitively_are_one_unit_and_jobless_nodes_stand_alone() -> None:
    jobs_of = {"x1": {1}, "x2": {1, 2}, "x3": {2}, "lone": set()}
    nodes = ["lone", "x1", "x2", "x3"]
    assert least_useful(nodes, jobs_of) == 1
    assert share_out(nodes, jobs_of, 4) == nodes
    assert share_out(nodes, jobs_of, 3) == ["lone", "x1", "x2"]  # x's unit (3) does not fit
    assert share_out(nodes, jobs_of, 1) == ["lone"]


@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    made=st.integers(0, 40),
)
def test_share_out_gives_exactly_what_was_made_and_never_invents_a_node(
    sizes: list[int], made: int
) -> None:
    jobs_of = {f"j{j}n{i}": {j} for j, size in enumerate(sizes) for i in range(size)}
    nodes = list(jobs_of)
    got = share_out(nodes, jobs_of, made)
    assert len(got) == min(made, len(nodes)) and set(got) <= set(nodes)
    assert len(set(got)) == len(got)
    whole = [j for j in range(len(sizes)) if all(n in got for n in nodes if jobs_of[n] == {j})]
    # as many jobs are whole as a greedy fill in order allows
    left, greedy = made, 0
    for size in sizes:
        if size <= left:
            left -= size
            greedy += 1
    assert len(whole) >= greedy


def test_a_failed_node_releases_its_jobs_other_nodes_but_not_a_node_another_job_needs() -> None:
    jobs_of = {"n1": {7}, "n2": {7}, "n3": {7, 8}, "n4": {8}}
    nodes_of_job = {7: ["n1", "n2", "n3"], 8: ["n3", "n4"]}
    assert released_with("n1", jobs_of, nodes_of_job) == ["n2"]  # n3 also serves job 8
    assert released_with("n4", jobs_of, nodes_of_job) == []  # n3 still serves job 7
    assert released_with("n9", jobs_of, nodes_of_job) == []  # no job: nothing else goes
