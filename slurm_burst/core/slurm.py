"""Our own view of Slurm objects. Adapters translate Slurm's output into these;
nothing above the adapters sees Slurm's JSON."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from slurm_burst.core.errors import BurstError


class SchedulerError(BurstError):
    """A Slurm command failed or Slurm refused the change; the message is Slurm's words."""

    code = "SlurmError"


def check_update(
    names: Sequence[str],
    state: str | None,
    reason: str | None,
    addrs: Sequence[str] | None,
    hostnames: Sequence[str] | None,
) -> None:
    """What every ``Scheduler.update_nodes`` refuses before asking Slurm: addresses or
    host names that do not pair one-to-one with the names, or nothing to change."""
    if addrs is not None and len(addrs) != len(names):
        raise ValueError("addrs must pair one-to-one with names")
    if hostnames is not None and len(hostnames) != len(names):
        raise ValueError("hostnames must pair one-to-one with names")
    if state is None and reason is None and addrs is None and hostnames is None:
        raise ValueError("nothing to update")


# A node in one of these states (or with one of these flags) has not registered yet.
UNREGISTERED_STATES = frozenset({"down", "future", "unknown"})
UNREGISTERED_FLAGS = frozenset(
    {"POWERED_DOWN", "POWERING_UP", "POWERING_DOWN", "POWER_DOWN", "NOT_RESPONDING"}
)


def parse_state_field(value: str) -> tuple[str, frozenset[str]]:
    """``IDLE+CLOUD+POWERING_UP`` (scontrol's ``State=``) -> ("idle", {CLOUD, POWERING_UP}).

    A base state printed with sinfo's mark (``IDLE*``, ``MIXED#``) gets the flag the
    mark stands for.
    """
    base, *rest = value.split("+")
    flags = set(rest)
    for mark, flag in (("*", "NOT_RESPONDING"), ("~", "POWERED_DOWN"), ("#", "POWERING_UP"),
                       ("%", "POWERING_DOWN"), ("!", "POWER_DOWN")):  # fmt: skip
        if base.endswith(mark):
            base = base[: -len(mark)]
            flags.add(flag)
    return base.lower(), frozenset(flags)


class SlurmNode(NamedTuple):
    """A node as sinfo reports it (a NamedTuple: 20,000 are read every reconcile pass)."""

    name: str
    state: str  # base state, lower case: idle, mixed, allocated, down, ...
    flags: frozenset[str] = frozenset()  # CLOUD, POWERED_DOWN, POWERING_UP, DRAIN, ...
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    gres: str = ""
    addr: str = ""
    hostname: str = ""
    reason: str = ""
    cpus: int = 0
    real_memory_mb: int = 0
    boot_time: datetime | None = None

    @property
    def is_cloud(self) -> bool:
        return "CLOUD" in self.flags

    @property
    def powered_down(self) -> bool:
        return "POWERED_DOWN" in self.flags

    @property
    def powering_up(self) -> bool:
        return "POWERING_UP" in self.flags

    @property
    def registered(self) -> bool:
        """slurmctld has heard from this node's slurmd since it was powered up: nothing
        about power saving or a missing slurmd is left in its state."""
        return self.state not in UNREGISTERED_STATES and not self.flags & UNREGISTERED_FLAGS

    @property
    def sinfo_state(self) -> str:
        """The state as sinfo prints it, with its power-saving suffix (idle~, mixed#, ...)."""
        suffix = ""
        for flag, mark in (
            ("POWERED_DOWN", "~"),
            ("POWERING_UP", "#"),
            ("POWERING_DOWN", "%"),
            ("POWER_DOWN", "!"),
            ("NOT_RESPONDING", "*"),
        ):
            if flag in self.flags:
                suffix = mark
                break
        return f"{self.state}{suffix}"


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, ...
    partition: str
    nodes: str = ""  # hostlist expression, empty while pending
    account: str = ""
    user: str = ""
    time_limit_min: int | None = None  # None = unlimited
    tres_requested: dict[str, str] = field(default_factory=dict)
    tres_allocated: dict[str, str] = field(default_factory=dict)
    node_count: int = 0
    cpus: int = 0
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    reason: str = ""


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    nodes: str  # hostlist expression
    state: str
    max_time: str
    default: bool = False
    total_nodes: int = 0
    suspend_time: str = ""


# The Slurm releases slurm-burst is tested against: bookworm's, trixie's, and the newest
# release Debian carries (sid, November 2026). Named, not a moving target.
SUPPORTED_RELEASES = ("22.05", "24.11", "26.05")


def release_of(version: str) -> str:
    """``slurm 24.11.5`` or ``24.11.5`` -> ``24.11``; ValueError when it is neither."""
    m = re.search(r"\b(\d{2})\.(\d{2})(?:\.\d+)?\b", version)
    if m is None:
        raise ValueError(f"not a Slurm version: {version[:80]!r}")
    return f"{m.group(1)}.{m.group(2)}"


def release_key(release: str) -> tuple[int, int]:
    major, minor = release.split(".")
    return int(major), int(minor)


# Major releases in order: Slurm's mixed-version window counts them, not years.
MAJOR_RELEASES = ("20.02", "20.11", "21.08", "22.05", "23.02", "23.11", "24.05", "24.11",
                  "25.05", "25.11", "26.05")  # fmt: skip


def mixed_version_problem(slurmctld: str, slurmd: str) -> str | None:
    """Why a node's slurmd of release ``slurmd`` cannot join a slurmctld of ``slurmctld``,
    or None. slurmd may not be newer than slurmctld, nor older than Slurm supports:
    two major releases before 24.11, three from 24.11 on (Slurm's upgrade guide)."""
    if release_key(slurmd) > release_key(slurmctld):
        return f"slurmd {slurmd} is newer than slurmctld {slurmctld}"
    if slurmctld not in MAJOR_RELEASES or slurmd not in MAJOR_RELEASES:
        return None  # a release this table does not know: only the order can be told
    window = 3 if release_key(slurmctld) >= (24, 11) else 2
    behind = MAJOR_RELEASES.index(slurmctld) - MAJOR_RELEASES.index(slurmd)
    if behind > window:
        return (
            f"slurmd {slurmd} is {behind} major releases behind slurmctld {slurmctld}; "
            f"Slurm {slurmctld} accepts {window}"
        )
    return None
