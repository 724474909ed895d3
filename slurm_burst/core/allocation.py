"""Cost allocation (the OpenCost model): an instance's cost split among its jobs.

An instance costs ``price * (terminated - requested)``. Its life is cut at every
UTC midnight and at every start and end of a job that held its node. In each
piece, a job pays the share of the node it was allocated (its CPUs out of the
node's CPUs, or its GPUs out of the node's GPUs for a GPU size); what no job
held in that piece (boot, bootstrap, idle before suspend, a launch that failed)
is *overhead*. Overhead is then spread over the jobs that used the instance,
by usage share (``rule="usage"``), or booked to the site account
(``rule="site"``, and always when no job used the instance).

Accounts with their own rate pay that rate for their usage; the difference from
their share of the provider price is a ``rate_adjustment`` line booked to the
site account, so the lines of an instance still add up to its provider cost.

Money is integer micro-dollars and every split is a largest-remainder split,
so the lines of an instance add up to its cost exactly: every micro-dollar of
provider cost appears exactly once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction
from itertools import pairwise

from slurm_burst.core.pricing import cost_micros

DAY_MS = 86_400_000
USAGE, OVERHEAD, RATE_ADJUSTMENT = "usage", "overhead", "rate_adjustment"


@dataclass(frozen=True)
class InstanceSpan:
    """A closed instance life; times are epoch milliseconds."""

    instance_id: str
    node: str
    partition: str
    start_ms: int
    end_ms: int
    micros_per_hour: int
    cpus: int
    gpus: int = 0

    @property
    def cost(self) -> int:
        return cost_micros(self.micros_per_hour, self.end_ms - self.start_ms)


@dataclass(frozen=True)
class JobSpan:
    """A job's hold on one node: its allocation there and its times (epoch ms)."""

    job_key: str
    account: str
    user: str
    start_ms: int
    end_ms: int
    cpus: int  # CPUs allocated on this node
    gpus: int = 0  # GPUs allocated on this node


@dataclass(frozen=True)
class Charge:
    """One line of the allocation: who pays how much of which instance, on which day."""

    instance_id: str
    day: str  # YYYY-MM-DD (UTC)
    kind: str  # usage, overhead or rate_adjustment
    account: str
    user: str
    partition: str
    job_key: str  # "" for lines of no job
    amount_micros: int
    node_ms: int  # node time this line stands for (node share * duration)
    gpu_ms: int  # GPU time this line stands for


@dataclass(frozen=True)
class Allocation:
    """An instance's split: its provider cost, the overhead rule used, and its lines."""

    instance_id: str
    total_micros: int
    rule: str
    charges: Sequence[Charge]


def split(total: int, weights: Sequence[Fraction]) -> list[int]:
    """Integers proportional to ``weights`` that add up to ``total`` exactly.

    Largest remainder (Hamilton): floor every share, then hand the units left
    over to the largest remainders, earliest first on ties (deterministic).
    Works for a negative ``total`` too.
    """
    wsum = sum(weights, Fraction(0))
    if not weights:
        return []
    if wsum == 0:
        return [total] + [0] * (len(weights) - 1)
    sign = -1 if total < 0 else 1
    mag = abs(total)
    exact = [mag * w / wsum for w in weights]
    floors = [int(e) for e in exact]  # weights >= 0, so int() floors
    left = mag - sum(floors)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += 1
    return [sign * f for f in floors]


def _day(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def _cuts(inst: InstanceSpan, jobs: Sequence[JobSpan]) -> list[int]:
    cuts = {inst.start_ms, inst.end_ms}
    first_midnight = (inst.start_ms // DAY_MS + 1) * DAY_MS
    cuts.update(range(first_midnight, inst.end_ms, DAY_MS))
    for j in jobs:
        for t in (j.start_ms, j.end_ms):
            if inst.start_ms < t < inst.end_ms:
                cuts.add(t)
    return sorted(cuts)


@dataclass
class _Acc:
    amount: int = 0
    node_ms: int = 0
    gpu_ms: int = 0


def allocate(
    inst: InstanceSpan,
    jobs: Sequence[JobSpan],
    *,
    rule: str = "usage",
    site_account: str = "burst-overhead",
    overrides: Mapping[str, int] | None = None,
) -> list[Charge]:
    """The charge lines of ``inst``; their amounts add up to ``inst.cost`` exactly.

    ``jobs`` are the jobs that held the instance's node (others are ignored by
    time); ``overrides`` maps an account to its own price per hour (micro-dollars).
    """
    jobs = [j for j in jobs if j.end_ms > inst.start_ms and j.start_ms < inst.end_ms]
    by_gpu = inst.gpus > 0
    capacity = inst.gpus if by_gpu else max(1, inst.cpus)
    usage: dict[tuple[str, JobSpan], _Acc] = defaultdict(_Acc)
    idle: dict[str, _Acc] = defaultdict(_Acc)
    cuts = _cuts(inst, jobs)
    for a, b in pairwise(cuts):
        dur = b - a
        cost = cost_micros(inst.micros_per_hour, b - inst.start_ms) - cost_micros(
            inst.micros_per_hour, a - inst.start_ms
        )
        active = [j for j in jobs if j.start_ms < b and j.end_ms > a]
        shares = [Fraction(j.gpus if by_gpu else j.cpus, capacity) for j in active]
        held = sum(shares, Fraction(0))
        if held > 1:  # never more than the whole node, whatever the records say
            shares = [s / held for s in shares]
            held = Fraction(1)
        weights = [*shares, 1 - held]
        day = _day(a)
        amounts = split(cost, weights)
        node_ms = split(dur, weights)
        gpu_ms = split(dur * inst.gpus, weights)
        for i, j in enumerate(active):
            acc = usage[(day, j)]
            acc.amount += amounts[i]
            acc.node_ms += node_ms[i]
            acc.gpu_ms += gpu_ms[i]
        acc = idle[day]
        acc.amount += amounts[-1]
        acc.node_ms += node_ms[-1]
        acc.gpu_ms += gpu_ms[-1]

    lines: list[Charge] = []
    for (day, j), acc in usage.items():
        lines.append(
            Charge(
                inst.instance_id,
                day,
                USAGE,
                j.account,
                j.user,
                inst.partition,
                j.job_key,
                acc.amount,
                acc.node_ms,
                acc.gpu_ms,
            )
        )
    lines += _spread_overhead(inst, idle, lines, rule, site_account)
    lines += _rate_adjustments(inst, lines, overrides or {}, site_account)
    return sorted(lines, key=lambda c: (c.day, c.kind, c.job_key, c.account))


def _spread_overhead(
    inst: InstanceSpan,
    idle: Mapping[str, _Acc],
    usage: Sequence[Charge],
    rule: str,
    site_account: str,
) -> list[Charge]:
    """Overhead lines: spread over the instance's jobs by usage share, or to the site."""
    out: list[Charge] = []
    by_job: dict[tuple[str, str, str], list[int]] = {}
    for c in usage:
        tot = by_job.setdefault((c.job_key, c.account, c.user), [0, 0])
        tot[0] += c.amount_micros
        tot[1] += c.node_ms
    payers = sorted(by_job)
    if payers and any(by_job[p][0] for p in payers):
        weights = [Fraction(by_job[p][0]) for p in payers]
    else:  # a free instance: share by node time instead
        weights = [Fraction(by_job[p][1]) for p in payers]
    for day, acc in sorted(idle.items()):
        if acc.amount == 0 and acc.node_ms == 0 and acc.gpu_ms == 0:
            continue
        if rule == "site" or not payers or sum(weights) == 0:
            out.append(
                Charge(
                    inst.instance_id,
                    day,
                    OVERHEAD,
                    site_account,
                    "",
                    inst.partition,
                    "",
                    acc.amount,
                    acc.node_ms,
                    acc.gpu_ms,
                )
            )
            continue
        amounts = split(acc.amount, weights)
        node_ms = split(acc.node_ms, weights)
        gpu_ms = split(acc.gpu_ms, weights)
        for i, (job_key, account, user) in enumerate(payers):
            if amounts[i] or node_ms[i] or gpu_ms[i]:
                out.append(
                    Charge(
                        inst.instance_id,
                        day,
                        OVERHEAD,
                        account,
                        user,
                        inst.partition,
                        job_key,
                        amounts[i],
                        node_ms[i],
                        gpu_ms[i],
                    )
                )
    return out


def _rate_adjustments(
    inst: InstanceSpan, lines: list[Charge], overrides: Mapping[str, int], site_account: str
) -> list[Charge]:
    """Reprice usage lines of accounts with their own rate (in place); return the differences.

    Each difference (provider share minus the account's own price) is booked to the
    site account, so the instance's lines keep adding up to its provider cost.
    """
    out = []
    for i, c in enumerate(lines):
        if c.kind != USAGE or c.account not in overrides:
            continue
        own = cost_micros(overrides[c.account], c.node_ms)
        diff = c.amount_micros - own
        if diff:
            lines[i] = replace(c, amount_micros=own)
            out.append(
                Charge(
                    inst.instance_id,
                    c.day,
                    RATE_ADJUSTMENT,
                    site_account,
                    "",
                    inst.partition,
                    c.job_key,
                    diff,
                    0,
                    0,
                )
            )
    return out
