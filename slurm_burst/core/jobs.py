"""A multi-node job gets all its nodes or none: which nodes serve which jobs, how a
partial launch is shared out, and which nodes a failed node takes down with it.

A node's jobs are the resume file's jobs that list it (``SLURM_RESUME_FILE``; stored on
the node as JSON dicts with ``job_id`` and ``nodes``). A node no job lists (a resume by
hand, a resume file that was unusable) is a job of its own: it stands or falls alone.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from slurm_burst.core.hostlist import DEFAULT_MAX_NAMES, HostlistError, expand_unique


def job_nodes(job: Mapping[str, Any], max_names: int = DEFAULT_MAX_NAMES) -> list[str]:
    """The nodes ``job`` (a resume-file job as stored) lists; [] if its hostlist does
    not parse or names more than ``max_names``."""
    try:
        return expand_unique(str(job.get("nodes", "")), max_names=max_names)
    except HostlistError:
        return []


def jobs_by_node(
    jobs: Iterable[Mapping[str, Any]], names: Collection[str]
) -> dict[str, list[dict[str, Any]]]:
    """Each of ``names``' jobs among ``jobs``. A job whose hostlist does not parse, or
    that names more nodes than ``names`` holds, is left out (it cannot be one of ours)."""
    wanted = set(names)
    out: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        for n in job_nodes(job, max(1, len(wanted))):
            if n in wanted:
                out.setdefault(n, []).append(dict(job))
    return out


def nodes_by_job(jobs: Iterable[Mapping[str, Any]]) -> dict[int, list[str]]:
    """Each of ``jobs``' ids with the nodes it lists (a job whose hostlist does not
    parse, or without an id, is left out)."""
    out: dict[int, list[str]] = {}
    for job in jobs:
        nodes = job_nodes(job)
        for j in job_ids([job]) if nodes else ():
            out[j] = nodes
    return out


def job_ids(jobs: Iterable[Mapping[str, Any]]) -> set[int]:
    """The ids of ``jobs`` (dicts as stored on a node); malformed entries are skipped."""
    out = set()
    for j in jobs:
        try:
            out.add(int(j["job_id"]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _units(nodes: Sequence[str], jobs_of: Mapping[str, set[int]]) -> list[list[str]]:
    """``nodes`` grouped into what must be served together, in the order each group's
    first node appears: nodes sharing a job are one unit (transitively); a node with
    no job is a unit of its own."""
    parent = {n: n for n in nodes}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    first_of_job: dict[int, str] = {}
    for n in nodes:
        for j in sorted(jobs_of.get(n, ())):
            if j in first_of_job:
                a, b = root(first_of_job[j]), root(n)
                if a != b:
                    parent[b] = a
            else:
                first_of_job[j] = n
    units: dict[str, list[str]] = {}
    for n in nodes:
        units.setdefault(root(n), []).append(n)
    return list(units.values())


def least_useful(nodes: Sequence[str], jobs_of: Mapping[str, set[int]]) -> int:
    """The fewest instances worth launching for ``nodes``: the smallest unit's size (a
    partial launch below it would serve no job whole)."""
    return min((len(u) for u in _units(nodes, jobs_of)), default=1)


def share_out(nodes: Sequence[str], jobs_of: Mapping[str, set[int]], made: int) -> list[str]:
    """Which ``made`` of ``nodes`` get the instances of a partial launch: whole units
    first, in order, skipping a unit that does not fit in what is left; then what is
    left goes to the first units not served, in order (they may complete on the next
    size). Deterministic: recovery after a crash shares the same way."""
    if made >= len(nodes):
        return list(nodes)
    units = _units(nodes, jobs_of)
    chosen: list[str] = []
    waiting: list[list[str]] = []
    left = made
    for unit in units:
        if len(unit) <= left:
            chosen += unit
            left -= len(unit)
        else:
            waiting.append(unit)
    for unit in waiting:
        take = unit[:left]
        chosen += take
        left -= len(take)
    order = {n: i for i, n in enumerate(nodes)}
    return sorted(chosen, key=order.__getitem__)


def released_with(
    failed: str, jobs_of: Mapping[str, set[int]], nodes_of_job: Mapping[int, Collection[str]]
) -> list[str]:
    """The nodes to release because ``failed`` failed: every other node of its jobs
    whose every job is one of them (a node also serving a job that is not failing stays)."""
    doomed = jobs_of.get(failed, set())
    out: list[str] = []
    for j in sorted(doomed):
        for n in nodes_of_job.get(j, ()):
            mine = jobs_of.get(n, set())
            if n != failed and n not in out and mine and mine <= doomed:
                out.append(n)
    return out
