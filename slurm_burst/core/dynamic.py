"""Dynamic node groups (``nodes = "dynamic"``, Slurm 23.11+): which of a group's nodes
slurmctld should hold, and which it may lose.

A dynamic group has no NodeName line in slurm.conf. Its first ``max_nodes`` names (the
group's pattern, as for a declared group) are created in slurmctld with ``scontrol
create ... State=CLOUD``: powered down, schedulable, resumed through power saving like
any CLOUD node, and kept in slurmctld's state across its restarts. A name past the
limit (the limit lowered, the group's count shrunk) is deleted once it is safe, and a
node carrying a dynamic group's feature (``sbdyn_<group>``) whose group is no longer
dynamic in the config is deleted the same way.

Safe to delete: what Slurm itself checks (no job on it, none completing, not in a
reservation: ``_delete_node_ptr`` in ``src/slurmctld/node_mgr.c``) and what only we know:
powered down, no power transition under way, and no instance of ours (no record, or one
terminated). Slurm deletes an idle node that is powered up, so that last part is ours
to keep: a node with a live instance stays until its release.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.slurm import SlurmNode

# Flags of a node that Slurm or a person still holds: never deleted under them.
HELD_FLAGS = frozenset({
    "RESERVED", "MAINTENANCE", "COMPLETING", "POWERING_UP", "POWERING_DOWN", "POWER_DOWN",
    "REBOOT_REQUESTED", "REBOOT_ISSUED",
})  # fmt: skip


@dataclass(frozen=True)
class DynamicPlan:
    create: tuple[str, ...] = ()  # within the limit and not in slurmctld
    delete: tuple[str, ...] = ()  # past the limit (or of no dynamic group) and safe to go
    waiting: tuple[str, ...] = ()  # past the limit but still held: deleted once released


def deletable(node: SlurmNode, state: NodeState | None) -> bool:
    """``node`` may be deleted: powered down and idle, no job, no reservation, no
    transition, and no instance of ours behind it (``state``: its record's)."""
    return (
        node.state == "idle"
        and node.powered_down
        and not node.flags & HELD_FLAGS
        and (state is None or state == NodeState.TERMINATED)
    )


def plan_dynamic(
    names: Sequence[str],
    limit: int,
    states: Mapping[str, NodeState],
    slurm: Mapping[str, SlurmNode],
    *,
    create: bool = True,
) -> DynamicPlan:
    """One pass over a dynamic group: ``names`` its nodes in order (pattern 1..count),
    ``limit`` its max_nodes, ``states`` our records' states, ``slurm`` what slurmctld
    holds of them. ``create``: False while the group may not grow (protected). A node
    deleted under a live instance of ours is made again once that is torn down."""
    # a name whose instance is still ours waits for its teardown (SlurmNodeGone) first
    missing = tuple(n for n in names[:limit] if create and n not in slurm
                    and states.get(n, NodeState.TERMINATED) == NodeState.TERMINATED)  # fmt: skip
    past = [n for n in names[limit:] if n in slurm]
    delete = tuple(n for n in past if deletable(slurm[n], states.get(n)))
    return DynamicPlan(missing, delete, tuple(n for n in past if n not in delete))


def strays(
    nodes: Iterable[SlurmNode], dynamic_features: Iterable[str], prefix: str
) -> list[SlurmNode]:
    """Nodes carrying a dynamic group's feature (``prefix``...) that no dynamic group of
    the config has (``dynamic_features``): a group removed or made declared."""
    keep = set(dynamic_features)
    return [n for n in nodes
            if any(f.startswith(prefix) and f not in keep for f in n.features)]  # fmt: skip
