"""Placement groups made per job: which may go. Pure: no I/O.

A multi-node job of a group with ``placement = "cluster"`` launches into a placement
group of its own (``services.launcher``), recorded in the state store before it is
made. It may be deleted once no node record holds an instance in it: a node keeps its
instance after its job ends until Slurm suspends it (``suspend_time`` idle), so a
job's placement group outlives the job by that long.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from slurm_burst.core.nodestate import NodeState


class Placed(Protocol):
    """What is read of a node record (``NodeRecord`` has it)."""

    @property
    def state(self) -> NodeState: ...
    @property
    def placement(self) -> str: ...


def unheld(made: Mapping[str, str], records: Iterable[Placed]) -> list[tuple[str, str]]:
    """``(name, provider)`` of the placement groups in ``made`` (name -> provider) that no
    node holds an instance in, or may soon (every state but terminated: a node launching
    into it has its record set before the call)."""
    held = {r.placement for r in records if r.placement and r.state != NodeState.TERMINATED}
    return sorted((name, provider) for name, provider in made.items() if name not in held)
