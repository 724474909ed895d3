"""When a job's cloud nodes are ready for it: what the PrologSlurmctld decides, each look.

Slurm runs PrologSlurmctld when it allocates a job, before powered-down nodes are
up, and launches a batch job as soon as the prolog ends with its nodes registered
(otherwise only at its 30-second periodic check). The prolog therefore waits until
every burst node of the job has joined *and* the daemon has seen slurmctld hear from
its slurmd, then lets Slurm go. A node that fails meanwhile ends the wait with a
failure: Slurm requeues a batch job whose PrologSlurmctld fails (an interactive one
is cancelled), and the node's reason already says why.

Pure: records and times in, a verdict out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.records import NodeRecord

READY, WAIT, FAIL = "ready", "wait", "fail"
ENDED = (NodeState.FAILED, NodeState.TERMINATING, NodeState.TERMINATED)


@dataclass(frozen=True)
class Verdict:
    kind: str  # READY, WAIT or FAIL
    message: str = ""
    waiting: tuple[str, ...] = ()  # nodes not ready yet (WAIT)


def node_ready(rec: NodeRecord | None) -> bool:
    return (
        rec is not None
        and rec.state == NodeState.JOINED
        and rec.want == Want.UP
        and rec.registered_at > 0
    )


def judge(
    names: Sequence[str],
    records: Mapping[str, NodeRecord],
    started: float,
    daemon_age: float | None,
    stale_after: float,
) -> Verdict:
    """The verdict on ``names`` (the job's burst nodes) given their ``records``.

    ``started`` is when the prolog began (the job's allocation, give or take): a node
    that ended (failed, torn down) since then failed this job; one that ended before
    is the end of an earlier life, and its resume for this job is still to come.
    ``daemon_age`` is the age of the daemon's heartbeat (None: it never ran). A node
    torn down while still wanted up is getting a new instance (a burst-buffer job's
    node, ``Provisioner._replace``): not an end.
    """
    for name in names:
        rec = records.get(name)
        replacing = rec is not None and rec.state != NodeState.FAILED and rec.want == Want.UP
        if rec is not None and rec.state in ENDED and rec.state_since >= started and not replacing:
            what = rec.error or str(rec.state)
            detail = f": {rec.message}" if rec.message else ""
            return Verdict(FAIL, f"node {name} {what}{detail}")
    if daemon_age is None or daemon_age > stale_after:
        said = "never ran" if daemon_age is None else f"heartbeat {daemon_age:.0f} s old"
        return Verdict(FAIL, f"slurm-burst daemon not running ({said}); nobody brings the "
                             "nodes up")  # fmt: skip
    waiting = tuple(n for n in names if not node_ready(records.get(n)))
    if waiting:
        return Verdict(WAIT, waiting=waiting)
    return Verdict(READY)
