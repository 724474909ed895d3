"""What slurmctld tells ResumeProgram about the jobs behind a resume (``SLURM_RESUME_FILE``).

Slurm 22.05 writes ``{"all_nodes": "burst-[1-2]", "jobs": [{"job_id": 1, "nodes":
"burst-[1-2]"}]}``; 23.02+ adds ``all_nodes_resume`` and, per job, ``nodes_alloc``,
``nodes_resume``, ``partition``, ``features``, ``extra``, ``reservation``,
``oversubscribe`` (26.05: ``exclusive``, ``priority``). Both shapes parse into
:class:`ResumeInfo`. A file that is absent or malformed is not fatal: the hook falls
back to its hostlist argument and logs why.

Pure: the caller reads the file (at once: it vanishes when slurmctld exits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slurm_burst.core.errors import BadInput
from slurm_burst.core.jsonread import BadJson, read_json


class ResumeFileError(BadInput, ValueError):
    """The resume file is not what Slurm writes; the message says what is wrong."""

    code = "BadResumeFile"


@dataclass(frozen=True)
class ResumeJob:
    job_id: int
    nodes: str  # hostlist of the job's nodes being resumed
    partition: str = ""
    features: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResumeInfo:
    all_nodes: str
    jobs: tuple[ResumeJob, ...] = ()
    shape: str = "22.05"  # or "23.02+"


def parse_resume_file(text: str) -> ResumeInfo:
    """The resume file's nodes and jobs; :class:`ResumeFileError` for anything else."""
    try:
        doc = read_json(text, "the resume file")
    except BadJson as exc:  # huge numbers, deep nesting, NaN
        raise ResumeFileError(str(exc)) from exc
    if not isinstance(doc, dict):
        raise ResumeFileError("top level is not an object")
    newer = "all_nodes_resume" in doc
    all_nodes = doc.get("all_nodes_resume") if newer else doc.get("all_nodes")
    if not isinstance(all_nodes, str) or not all_nodes.strip():
        raise ResumeFileError("no 'all_nodes' / 'all_nodes_resume' hostlist")
    raw_jobs = doc.get("jobs", [])
    if not isinstance(raw_jobs, list):
        raise ResumeFileError("'jobs' is not a list")
    jobs = []
    for i, j in enumerate(raw_jobs):
        if not isinstance(j, dict):
            raise ResumeFileError(f"jobs[{i}] is not an object")
        job_id = j.get("job_id")
        nodes = j.get("nodes_resume", j.get("nodes", ""))
        if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 < job_id < 2**32:
            raise ResumeFileError(f"jobs[{i}].job_id is not a Slurm job id")
        if not isinstance(nodes, str):
            raise ResumeFileError(f"jobs[{i}] nodes is not a hostlist string")
        known = {"job_id", "nodes", "nodes_resume", "partition", "features"}
        jobs.append(
            ResumeJob(
                job_id=job_id,
                nodes=nodes,
                partition=str(j.get("partition") or ""),
                features=str(j.get("features") or ""),
                extra={k: v for k, v in j.items() if k not in known},
            )
        )
    return ResumeInfo(
        all_nodes=all_nodes.strip(), jobs=tuple(jobs), shape="23.02+" if newer else "22.05"
    )
