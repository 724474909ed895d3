"""The life of a cloud node, as the daemon records it: a small explicit state machine.

::

    requested -> launching -> booting -> bootstrapping -> joined
        \\            \\           \\             \\            \\
         +------------+-----------+-------------+------------+--> terminating -> terminated
    any state before joined --(error code)--> failed --> terminating -> terminated

``requested``    a resume hook asked for the node; nothing exists in the cloud yet.
``launching``    create_node is being called (an idempotency token is fixed first,
                 so a retry after a crash finds the same instance).
``booting``      the instance exists; waiting for it to run and for its SSH host key.
``bootstrapping`` over SSH: WireGuard, munge, NodeAddr, slurmd.
``joined``       slurmd runs on the node, reachable over the mesh.
``terminating``  a suspend (or a failure) is tearing the node down.
``terminated``   nothing of the node is left in the cloud, on the hub or in the pool.
``failed``       a step failed; ``error`` holds a code such as ``BootTimeout`` that ends
                 up in the Slurm node reason as ``(Code:BootTimeout)``.

Pure: no I/O, no clock. The daemon persists every transition before acting on it.
"""

from __future__ import annotations

from enum import StrEnum

from slurm_burst.core.errors import BurstError


class NodeState(StrEnum):
    REQUESTED = "requested"
    LAUNCHING = "launching"
    BOOTING = "booting"
    BOOTSTRAPPING = "bootstrapping"
    JOINED = "joined"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class Want(StrEnum):
    """What was last asked of the node: Slurm resumed it (up) or suspended it (down)."""

    UP = "up"
    DOWN = "down"

    def __str__(self) -> str:
        return self.value


TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.REQUESTED: frozenset(
        {NodeState.LAUNCHING, NodeState.FAILED, NodeState.TERMINATING, NodeState.TERMINATED}
    ),
    NodeState.LAUNCHING: frozenset({NodeState.BOOTING, NodeState.FAILED, NodeState.TERMINATING}),
    NodeState.BOOTING: frozenset(
        {NodeState.BOOTSTRAPPING, NodeState.FAILED, NodeState.TERMINATING}
    ),
    NodeState.BOOTSTRAPPING: frozenset({NodeState.JOINED, NodeState.FAILED, NodeState.TERMINATING}),
    NodeState.JOINED: frozenset({NodeState.TERMINATING, NodeState.FAILED}),
    NodeState.FAILED: frozenset({NodeState.TERMINATING, NodeState.TERMINATED}),
    NodeState.TERMINATING: frozenset({NodeState.TERMINATED, NodeState.FAILED}),
    NodeState.TERMINATED: frozenset({NodeState.REQUESTED}),
}

# States in which the node may own cloud, mesh or Slurm resources.
LIVE = frozenset(
    {
        NodeState.LAUNCHING,
        NodeState.BOOTING,
        NodeState.BOOTSTRAPPING,
        NodeState.JOINED,
        NodeState.TERMINATING,
        NodeState.FAILED,
    }
)
# States in which a resume is already under way or done: a duplicate resume is a no-op.
RESUMING = frozenset(
    {
        NodeState.REQUESTED,
        NodeState.LAUNCHING,
        NodeState.BOOTING,
        NodeState.BOOTSTRAPPING,
        NodeState.JOINED,
    }
)


def needs_work(state: NodeState, want: Want) -> bool:
    """Whether the node is not yet where ``want`` says (the daemon drives it there)."""
    return state != (NodeState.JOINED if want == Want.UP else NodeState.TERMINATED)


class TransitionError(BurstError, ValueError):
    """A state change the machine does not allow (a bug or a race, never ignored)."""

    code = "BadTransition"


def check_transition(old: NodeState | None, new: NodeState) -> None:
    """Raise :class:`TransitionError` unless ``old -> new`` is allowed.

    ``old`` is None for a node the database has never seen: only ``requested``
    (a resume) or ``terminated`` (a suspend of a node we never launched) may start it.
    """
    if old is None:
        if new not in (NodeState.REQUESTED, NodeState.TERMINATED):
            raise TransitionError(f"a new node cannot start in state {new}")
        return
    if new == old and new in (NodeState.FAILED, NodeState.TERMINATING):
        return  # recording a second error, or a retried teardown
    if new not in TRANSITIONS[old]:
        raise TransitionError(f"{old} -> {new} is not a valid node transition")


def reason(code: str, message: str) -> str:
    """A Slurm node reason carrying the error code the way operators grep for it."""
    text = " ".join(message.split())[:200]
    return f"slurm-burst: {text} (Code:{code})"
