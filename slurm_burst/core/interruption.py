"""A provider's interruption notice (EC2's spot ``instance-action``; GCE's ``preempted``
and ``maintenance-event``): what it says, which signal a job asked for before its end,
and when to requeue it. Pure: no I/O.

EC2 says when the reclaim comes (two minutes after the notice), and so does Azure's
Scheduled Events (``NotBefore``: at least 30 s ahead for a Spot eviction, ``Preempt``;
empty once the event has started). Google's metadata server
says only that it comes: a preempted VM has about 30 seconds (``GCE_LEAD``), and a host
maintenance that terminates it is taken to leave no more (the shortest lead Google
documents for a reclaim), counted from when the daemon hears of it.

A job says what it wants before it is stopped with ``--signal=[{R|B}:]SIG[@TIME]``:
SIG (a name or a number) sent TIME seconds before its end, to its steps, or with ``B:``
to its batch shell only. An interruption is such an end: the job gets its signal at
once, and is requeued shortly before the reclaim (``margin`` seconds before it), so it
has as long as the provider gives to checkpoint. A job that asked for no signal is
requeued at once: Slurm's requeue sends SIGTERM, and SIGKILL ``KillWait`` later.

Slurm 22.05's commands do not show a job's ``--signal``: it is read from the job's
batch script (``#SBATCH --signal=...``, as sbatch reads the directives: up to the first
line that is neither blank nor a comment).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

ACTIONS = frozenset({"terminate", "stop", "hibernate"})  # EC2's, with the reclaim's time
# GCE's, as the node agent names what the metadata server said -> the reclaim's code
GCE_ACTIONS = {"preempted": "Preempted", "maintenance": "HostMaintenance"}
SPOT_CODE = "SpotInterruption"  # EC2's reclaims
# Azure's Scheduled Events the node agent passes on -> the reclaim's code (Freeze, a
# pause of seconds, is not one: the node keeps its jobs)
AZURE_ACTIONS = {"Preempt": "SpotEviction", "Terminate": "Terminated",
                 "Reboot": "HostMaintenance", "Redeploy": "HostMaintenance"}  # fmt: skip
NOT_CAPACITY = frozenset({"HostMaintenance", "Terminated"})  # reclaims that say nothing of it
GCE_LEAD = 30.0  # seconds between a GCE preemption notice and the stop
MARGIN = 10.0  # seconds before the reclaim at which a signalled job is requeued
_SIGNAL = re.compile(r"(?:([RB]):)?((?:SIG)?[A-Z][A-Z0-9+]*|[0-9]{1,2})(?:@([0-9]{1,5}))?")
_DIRECTIVE = re.compile(r"#SBATCH\s+--signal(?:=|\s+)(\S+)")


@dataclass(frozen=True)
class Notice:
    action: str  # terminate | stop | hibernate (EC2); preempted | maintenance (GCE); Azure's
    at: float  # unix time of the reclaim
    code: str = SPOT_CODE  # the reclaim's code (the node's failure, the ledger's)

    @property
    def capacity(self) -> bool:
        """Whether the reclaim says the size's spot capacity is short (a maintenance, or
        a delete someone asked for, does not)."""
        return self.code not in NOT_CAPACITY


@dataclass(frozen=True)
class Declared:
    """The signal a job asked for (``--signal``)."""

    signal: str  # as scancel takes it: a name without SIG, or a number
    batch_only: bool  # "B:": the batch shell only


def parse_notice(body: object, now: float) -> Notice:
    """A notice as a node's agent passes it on: EC2's JSON ``{"action", "time"}`` (a
    time in the past or more than a day ahead is clamped), or GCE's ``{"action":
    "preempted" | "maintenance"}`` (the reclaim ``GCE_LEAD`` seconds from ``now``: a
    time the node gives is not taken); ValueError for anything else."""
    if not isinstance(body, dict):
        raise ValueError("a notice is a JSON object")
    action, when = body.get("action"), body.get("time")
    if isinstance(action, str) and action in GCE_ACTIONS:
        return Notice(action, now + GCE_LEAD, GCE_ACTIONS[action])
    if isinstance(action, str) and action in AZURE_ACTIONS:
        return Notice(action, _not_before(when, now), AZURE_ACTIONS[action])
    if not isinstance(action, str) or action not in ACTIONS:  # a list is no action
        known = ", ".join(sorted(ACTIONS | set(GCE_ACTIONS) | set(AZURE_ACTIONS)))
        raise ValueError(f"action {str(action)[:40]!r}: one of {known}")
    if not isinstance(when, str) or len(when) > 40:
        raise ValueError("time: an ISO 8601 time such as 2026-11-27T15:04:05Z")
    try:
        at = datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"time {when!r}: not an ISO 8601 time") from None
    return Notice(str(action), _within_a_day(at, now))


def _not_before(when: object, now: float) -> float:
    """An Azure event's ``NotBefore`` (RFC 1123, ``Mon, 19 Sep 2016 18:29:47 GMT``) as a
    Unix time within a day of ``now``; '' (the event has started): ``now``."""
    from email.utils import parsedate_to_datetime

    if when in ("", None):
        return now
    if not isinstance(when, str) or len(when) > 40:
        raise ValueError("time: an RFC 1123 time such as Mon, 19 Sep 2016 18:29:47 GMT")
    try:
        at = parsedate_to_datetime(when).timestamp()
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"time {when!r}: not an RFC 1123 time") from None
    return _within_a_day(at, now)


def _within_a_day(at: float, now: float) -> float:
    """A reclaim time a node gave, kept from ``now`` to a day after (a node's clock, or
    word, is less trusted than ours)."""
    return min(max(at, now), now + 86_400)


def declared_signal(script: str) -> Declared | None:
    """The ``--signal`` of a batch script's ``#SBATCH`` directives (the last one wins, as
    for sbatch); None if it asks for none or names no signal sbatch would take."""
    found: Declared | None = None
    for n, line in enumerate(script.splitlines()):
        text = line.strip()
        if n == 0 and text.startswith("#!"):
            continue
        if text and not text.startswith("#"):
            break  # sbatch reads no directive after the first command
        m = _DIRECTIVE.match(text)
        if m is None:
            continue
        spec = _SIGNAL.fullmatch(m.group(1).upper())
        if spec is None:
            found = None
            continue
        name = spec.group(2).removeprefix("SIG")
        if name.isdigit() and not 0 < int(name) < 65:
            continue
        found = Declared(name, spec.group(1) == "B")
    return found


def requeue_at(notice: Notice, signalled: bool, now: float, margin: float = MARGIN) -> float:
    """When to requeue the node's jobs: shortly before the reclaim if they got a signal
    to checkpoint on, else at once."""
    return max(now, notice.at - margin) if signalled else now
