"""A node group's cap, ``max_nodes``: the most instances it has that are not terminating
(requested, launching, booting, bootstrapping, joined; idle ones included), kept in
Slurm's own terms so that jobs beyond it wait in the queue instead of resuming nodes the
daemon would refuse.

Slurm has no limit on how many nodes of a set may be *powered up*: a QOS's
``GrpTRES=node=N`` counts the nodes allocated to running jobs, so an idle node still
up (until its SuspendTime) or one powering up by hand escapes it, and a QOS belongs to
a partition, not to a node group. So the daemon keeps the group's powered-down nodes
unavailable beyond its room: room = cap - the nodes holding an instance (by our records,
or up or powering up in Slurm), and of the nodes Slurm could power up next, all but
``room`` are drained with a ``(Code:GroupAtCap)`` reason, lifted as room comes back. A
job that needs more then waits with Slurm's ``Resources`` reason and the drained nodes
say why (``sinfo -R``). Anything that still resumes past the cap (``scontrol update
state=power_up`` by hand) is refused by the daemon (:func:`over_cap`).

Pure: Slurm's node view and the records in, what to drain and undrain out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_burst.core.nodestate import RESUMING, NodeState, reason
from slurm_burst.core.slurm import SlurmNode

CODE = "GroupAtCap"
MARK = f"(Code:{CODE})"


def cap_reason(group: str, limit: int) -> str:
    """The reason a capped node carries in Slurm (what ``sinfo -R`` shows)."""
    return reason(
        CODE,
        f"node group {group} is at max_nodes={limit} instances; this node is free "
        "again when one of them is released",
    )


def holds_instance(state: NodeState) -> bool:
    """Whether a record in ``state`` has (or is getting) an instance not terminating."""
    return state in RESUMING


def holding(
    names: Iterable[str],
    states: Mapping[str, NodeState],
    slurm: Mapping[str, SlurmNode] | None = None,
) -> set[str]:
    """The group's nodes that hold a place under the cap: by our records, or by Slurm's
    view (up; powering up; or given a job while powered down, its resume on the way)."""
    out = set()
    for name in names:
        state = states.get(name)
        if state is not None and holds_instance(state):
            out.add(name)
            continue
        node = slurm.get(name) if slurm is not None else None
        if node is not None and not free(node):
            out.add(name)
    return out


def free(node: SlurmNode) -> bool:
    """Powered down (or on its way there) with no job: no instance, none coming."""
    going = node.powered_down or "POWERING_DOWN" in node.flags
    return going and not node.powering_up and node.state in ("idle", "down")


@dataclass(frozen=True)
class CapPlan:
    """One pass's work for a capped group."""

    holding: int  # nodes holding an instance (or about to)
    room: int  # more instances the cap allows
    drain: tuple[str, ...]  # powered-down nodes to make unavailable (our reason)
    release: tuple[str, ...]  # our drained nodes to make available again


def plan_cap(
    names: Sequence[str],
    limit: int,
    states: Mapping[str, NodeState],
    slurm: Mapping[str, SlurmNode],
    first: Iterable[str] = (),
) -> CapPlan:
    """What keeps ``names`` (a group's nodes, in index order) within ``limit``: of the
    nodes Slurm could power up (powered down with no job, or powering down: they come
    out of it available), not drained or down by anyone else, the first ``room`` stay
    available, ``first`` (the warm pool's, which its keeper powers up) before the others
    and the powered-down before the powering-down, and the rest carry our drain."""
    held = holding(names, states, slurm)
    room = max(0, limit - len(held))
    preferred = set(first)
    usable: list[SlurmNode] = []
    ours: set[str] = set()
    for name in names:
        node = slurm.get(name)
        if name in held or node is None or not free(node):
            continue
        if MARK in node.reason and "DRAIN" in node.flags:
            ours.add(name)
        elif "DRAIN" in node.flags or node.state == "down":
            continue  # someone else's: unavailable to Slurm either way
        usable.append(node)
    # stable: index order within each kind
    usable.sort(key=lambda n: (n.name not in preferred, not n.powered_down))
    keep = {n.name for n in usable[:room]}
    return CapPlan(
        holding=len(held),
        room=room,
        drain=tuple(n.name for n in usable if n.name not in keep and n.name not in ours),
        release=tuple(n.name for n in usable if n.name in keep and n.name in ours),
    )


def over_cap(group_states: Mapping[str, NodeState], limit: int, asked: Sequence[str]) -> list[str]:
    """Of ``asked`` (nodes a resume asks up, in order), those past ``limit``: the
    group's other nodes holding an instance come first, then ``asked`` in order."""
    held = sum(1 for n, s in group_states.items() if n not in asked and holds_instance(s))
    room = max(0, limit - held)
    return list(asked[room:])
