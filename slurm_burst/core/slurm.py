"""Our own view of Slurm objects. Adapters translate Slurm's output into these;
nothing above the adapters sees Slurm's JSON."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from slurm_burst.core.errors import BurstError
from slurm_burst.core.hostlist import expand
from slurm_burst.core.numbers import is_digits
from slurm_burst.core.slurmsyntax import is_node_name


class SchedulerError(BurstError):
    """A Slurm command failed or Slurm refused the change; the message is Slurm's words."""

    code = "SlurmError"


def check_update(
    names: Sequence[str],
    state: str | None,
    reason: str | None,
    addrs: Sequence[str] | None,
    hostnames: Sequence[str] | None,
    comment: str | None = None,
    instance: tuple[str, str, str] | None = None,
) -> None:
    """What every ``Scheduler.update_nodes`` refuses before asking Slurm: addresses or
    host names that do not pair one-to-one with the names, an instance for other than
    one node, or nothing to change."""
    if instance is not None and len(names) != 1:
        raise ValueError("an instance is one node's")
    if addrs is not None and len(addrs) != len(names):
        raise ValueError("addrs must pair one-to-one with names")
    if hostnames is not None and len(hostnames) != len(names):
        raise ValueError("hostnames must pair one-to-one with names")
    given = (state, reason, addrs, hostnames, comment, instance)
    if all(x is None for x in given):
        raise ValueError("nothing to update")


def check_names(names: Sequence[str]) -> None:
    """What ``Scheduler.create_nodes`` and ``delete_nodes`` refuse before asking Slurm:
    no names, or one that is not a node name (it would reach scontrol as a hostlist)."""
    if not names:
        raise ValueError("no node names")
    bad = next((n for n in names if not is_node_name(n)), None)
    if bad is not None:
        raise ValueError(f"{bad!r} is not a node name")


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
    instance_id: str = ""  # 23.11+: what the node's slurmd said (--instance-id)

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

    @property
    def activity(self) -> str:
        """What the node does, for a dashboard: busy (running jobs, drained or not),
        idle, powered_down (or powering down), powering_up, unavailable (down, drained
        idle, failed, not responding...)."""
        if self.powering_up:
            return "powering_up"
        if self.state in BUSY_STATES:
            return "busy"
        if self.powered_down or "POWERING_DOWN" in self.flags or "POWER_DOWN" in self.flags:
            return "powered_down"
        if self.state == "idle" and not self.flags & UNAVAILABLE_FLAGS:
            return "idle"
        return "unavailable"


BUSY_STATES = frozenset({"allocated", "mixed", "completing"})
UNAVAILABLE_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAIL", "NOT_RESPONDING"})


def node_activity(
    nodes: Iterable[SlurmNode], cloud: Callable[[str], object]
) -> dict[tuple[str, str], int]:
    """``{(side, activity): nodes}``: side is ``cloud`` for the nodes ``cloud(name)``
    claims (a burst group's), else ``onprem``."""
    out: dict[tuple[str, str], int] = {}
    for n in nodes:
        key = ("cloud" if cloud(n.name) else "onprem", n.activity)
        out[key] = out.get(key, 0) + 1
    return out


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
    m = re.search(r"\b([0-9]{2})\.([0-9]{2})(?:\.[0-9]+)?\b", version, re.ASCII)
    if m is None:
        raise ValueError(f"not a Slurm version: {version[:80]!r}")
    return f"{m.group(1)}.{m.group(2)}"


INSTANCE_FLAGS = (23, 11)  # slurmd --instance-id/--instance-type/--extra, sacctmgr show instance


def records_instances(release: str) -> bool:
    """Whether a slurmd of ``release`` tells slurmctld its cloud instance (23.11+)."""
    return release_key(release) >= INSTANCE_FLAGS


def instance_extra(provider: str, region: str, market: str, group: str, price: float | None) -> str:
    """The node's ``--extra`` (23.11+): what Slurm's own records of the instance lack,
    as compact JSON (Slurm keeps Extra as given; ``--extra`` constraints read JSON)."""
    facts: dict[str, object] = {"slurm_burst": {"provider": provider, "region": region,
                                                "market": market, "group": group}}  # fmt: skip
    if price is not None:
        facts["slurm_burst"]["price_per_hour"] = price  # type: ignore[index]
    return json.dumps(facts, sort_keys=True, separators=(",", ":"))


def instance_comment(instance_id: str, size: str, provider: str, region: str, market: str) -> str:
    """The same facts as a node comment, where slurmd cannot record them (before 23.11)."""
    where = f"{provider}/{region}" if region else provider
    return f"slurm-burst: instance {instance_id} {size} {where} {market}"


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


_JOB_NODE_GRES = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S* Mem=\S* GRES=(\S*)")
_GPU_IDX = re.compile(r"gpu[^(,]*\(IDX:([0-9,\-]*)\)")


def parse_job_gpus(text: str) -> dict[str, tuple[int, ...]]:
    """The GPU indices a job holds on each node, from ``scontrol -d -o show job ID``
    (its detail part: ``Nodes=gpu-[1-2] CPU_IDs=0-7 Mem=0 GRES=gpu:a100:2(IDX:0-1)``)."""
    out: dict[str, tuple[int, ...]] = {}
    for nodes, gres in _JOB_NODE_GRES.findall(text):
        indices: list[int] = []
        for idx in _GPU_IDX.findall(gres):
            for part in filter(None, idx.split(",")):
                lo, _, hi = part.partition("-")
                if not is_digits(lo) or (hi and not is_digits(hi)):
                    raise ValueError(f"GPU index list not understood: {idx[:80]!r}")
                first, last = int(lo), int(hi or lo)
                if last - first > 1024:
                    raise ValueError(f"GPU index range too large: {part!r}")
                indices.extend(range(first, last + 1))
        for node in expand(nodes):
            out[node] = tuple(sorted(set(indices)))
    return out


# -- the pending queue, as the burst policy reads it ---------------------------------------
# ``squeue --Format`` (one line per pending job; an array's pending tasks as one line,
# under the array's id), each field ended by "|", run with SLURM_TIME_FORMAT=%s so that
# times are unix seconds whatever the controller's locale and time zone. The same
# fields from 22.05 to 26.05.
QUEUE_FIELDS = (
    "JobID", "Partition", "Account", "QOS", "NumCPUs", "NumNodes", "tres-per-job",
    "tres-per-node", "TimeLimit", "SubmitTime", "PriorityLong", "StartTime", "Reason",
)  # fmt: skip
QUEUE_FORMAT = ",".join(f"{f}:|" for f in QUEUE_FIELDS)


# squeue: none of these fields can hold a '|'. %A is the job's own id, unique for each
# task of an array (%i would show an array task as ARRAYID_TASK, not its own id); %F the
# array's id (a job that is no array task: its own)
OWNER_FORMAT = "%A|%u|%U|%G|%a|%q|%P|%F"
_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,128}", re.ASCII)


@dataclass(frozen=True)
class JobOwner:
    """Whose a job is and where it may run: what a stage-in needs to act for it."""

    job_id: int
    user: str
    uid: int
    gid: int
    account: str
    qos: str
    partitions: tuple[str, ...]
    array_job_id: int = 0  # the array's own job id, if this is a task of another's


def is_job_id(text: str) -> bool:
    """``text`` is a Slurm job id as a hook is handed one: ASCII digits, 10 at most."""
    return is_digits(text) and len(text) <= 10


def array_script(path: str, job_id: int, array_job_id: int) -> str | None:
    """Where Slurm keeps an array task's batch script when ``path`` (what it handed the
    task's burst-buffer hook: ``STATE/hash.N/job.JOBID/script``, from 24.11 under the
    task's own id) is not it: under the array's id. None unless ``path`` has that shape
    for this job and the job is a task of another's array."""
    m = _SCRIPT_PATH.fullmatch(path)
    if m is None or int(m["job"]) != job_id or array_job_id in (0, job_id):
        return None
    return f"{m['root']}/hash.{array_job_id % 10}/job.{array_job_id}/script"


_SCRIPT_PATH = re.compile(r"(?P<root>/[^\0]*)/hash\.\d/job\.(?P<job>\d{1,10})/script", re.ASCII)


def parse_job_owner(text: str, job_id: int) -> JobOwner:
    """``squeue --noheader --jobs=ID --format=OWNER_FORMAT``; ValueError unless it is one
    line of that job with names Slurm could have given (a user's job name or comment is
    not among the fields: nothing of the user's can pose as one)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"0 lines for job {job_id}, not one")
    # --jobs=ID of an array's own job id lists all its tasks: the job is the line whose
    # own id (%A) is ID
    mine = [ln for ln in lines if ln.split("|", 1)[0] == str(job_id)]
    if len(mine) != 1:
        first = lines[0].split("|", 1)[0][:40]
        raise ValueError(f"{len(mine)} lines of job {job_id} (first: {first!r}), not one")
    fields = mine[0].split("|")
    if len(fields) != 8:
        raise ValueError(f"{len(fields)} fields, not 8: {mine[0][:200]!r}")
    _jid, user, uid, gid, account, qos, parts, array = fields
    if not (is_digits(uid) and is_digits(gid) and is_digits(array)):
        raise ValueError(f"uid {uid[:20]!r}, gid {gid[:20]!r}, array {array[:20]!r}: "
                         "not numbers")  # fmt: skip
    names = [user, account, *([qos] if qos else []), *parts.split(",")]
    bad = [n for n in names if not _NAME.fullmatch(n)]
    if bad:
        raise ValueError(f"{bad[0][:60]!r} is not a Slurm name")
    return JobOwner(job_id, user, int(uid), int(gid), account, qos, tuple(parts.split(",")),
                    int(array) if int(array) != job_id else 0)  # fmt: skip


class QueuedJob(NamedTuple):
    """A pending job, as the burst policy needs it (a tuple: 100,000 are read a pass)."""

    id: str  # an array's pending tasks: the array's id
    partitions: tuple[str, ...]
    account: str
    qos: str
    cpus: int
    nodes: int
    gpus: int  # in all (per node x nodes)
    limit: float  # seconds; math.inf: unlimited
    submit: float
    priority: float
    expected_start: float | None  # Slurm's backfill estimate; None: none yet
    reason: str


def parse_time_limit(text: str) -> float | None:
    """squeue's time limit (``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``, ``UNLIMITED``) in
    seconds; None: no limit."""
    if text in ("UNLIMITED", "INFINITE", "NOT_SET", "N/A"):
        return None
    days, sep, clock = text.rpartition("-")
    parts = clock.split(":")
    if (sep and not is_digits(days)) or len(parts) not in (2, 3):
        raise ValueError(f"time limit not understood: {text[:40]!r}")
    if not all(is_digits(p) and len(p) <= 9 for p in parts) or len(days) > 6:
        raise ValueError(f"time limit not understood: {text[:40]!r}")
    h, m, s = ([0] if len(parts) == 2 else []) + [int(p) for p in parts]
    return float(((int(days or 0) * 24 + h) * 60 + m) * 60 + s)


_GRES_GPU = re.compile(r"(?:gres[:/])?gpu(?::(?![0-9]+\Z)[^:]+)?(?::([0-9]+))?", re.ASCII)


def gpus_of(tres: str) -> int:
    """GPUs in a job's TRES request (``gres:gpu:2``, ``gres/gpu:a100:1``, ``N/A``)."""
    total = 0
    for token in tres.split(","):
        m = _GRES_GPU.fullmatch(token.strip())
        if m:
            total += int(m.group(1) or 1)
    return total


def parse_queue(text: str, known: dict[str, QueuedJob] | None = None) -> list[QueuedJob]:
    """``squeue --noheader --states=PD --Format=QUEUE_FORMAT`` (SLURM_TIME_FORMAT=%s).

    ``known``: the lines of the last read and their jobs. A line seen before is not
    parsed again (most of a queue is the same from one pass to the next); the dict is
    refilled with this read's lines."""
    out = []
    width = len(QUEUE_FIELDS)
    seen: dict[str, QueuedJob] = {}
    before = known or {}
    limits: dict[str, float] = {}
    gpus: dict[str, int] = {"N/A": 0}
    parts: dict[str, tuple[str, ...]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        job = before.get(line)
        if job is None:
            if not line.strip():
                continue
            f = line.split("|")
            if len(f) != width + 1 or (f[-1] and f[-1].strip()):
                raise ValueError(
                    f"squeue line {n}: {len(f) - 1} fields, {width} expected: {line[:120]!r}"
                )
            try:
                nodes = int(f[5]) or 1
                if f[8] not in limits:
                    limit = parse_time_limit(f[8])
                    limits[f[8]] = math.inf if limit is None else limit
                for tres in (f[6], f[7]):
                    if tres not in gpus:
                        gpus[tres] = gpus_of(tres)
                if f[1] not in parts:
                    parts[f[1]] = tuple(p for p in f[1].split(",") if p)
                start = f[11]
                job = QueuedJob(
                    f[0].strip(),
                    parts[f[1]],
                    f[2],
                    f[3],
                    int(f[4]),
                    nodes,
                    gpus[f[6]] + gpus[f[7]] * nodes,
                    limits[f[8]],
                    int(f[9]),  # ints: a float's parser would take "nan" and "1e9"
                    int(f[10]),
                    int(start) if is_digits(start) else None,
                    f[12].strip(),
                )
            except ValueError as exc:
                raise ValueError(f"squeue line {n}: {exc}: {line[:120]!r}") from exc
        seen[line] = job
        out.append(job)
    if known is not None:
        known.clear()
        known.update(seen)
    return out
