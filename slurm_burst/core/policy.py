"""The burst policy, pure: for each pending job that may burst, burst now, wait (and when
to look again), or never (and why). The daemon and the what-if simulator run this same
code.

The default, in one sentence: **a job bursts when it would wait on-prem longer than an
hour for each dollar its cloud nodes would cost, and at least ten minutes, unless its
account or QOS is on-prem only, no node group fits it, or its account's budget (or the
cluster's spend cap) cannot pay for it.** The threshold grows with the job's cost (its
nodes, their price, its time limit), so a cheap job bursts soon and a dear one only
when the wait it saves is long.

Inputs per job: its request (CPUs, GPUs, time limit, account, QOS, partitions), the
expected on-prem start (Slurm's backfill estimate or the simulator's own), the cheapest
cloud offer for its shape (price, boot delay), the money left, and for a job with
staged data what moving it takes (:class:`DataMove`): its time is added to the
threshold (a job whose data takes longer to move than it would wait on-prem stays
home), its dollars (and the nodes' time waiting for it) to the job's cost. A job that waits is
looked at again when its wait would cross its threshold. When money binds, the jobs
that still burst are chosen in Slurm's priority order (:func:`decide_all`), not by
arrival.
"""

from __future__ import annotations

import enum
import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol

from slurm_burst.core.pricing import GB


class Verdict(enum.StrEnum):
    BURST = "burst"
    WAIT = "wait"
    NEVER = "never"


@dataclass(frozen=True)
class Rule:
    """What a site sets per account, QOS or partition (the most specific wins)."""

    min_wait: float = 600.0  # seconds: never burst for a shorter expected wait
    wait_per_dollar: float = 3600.0  # seconds of expected wait each dollar must save
    wait_factor: float = 0.0  # and a wait longer than factor x time limit (0: not asked)
    max_job_cost: float | None = None  # dollars: never burst a job costing more
    onprem_only: bool = False  # sensitive data: never burst (Slurm enforces it too)
    recheck: float = 300.0  # seconds between looks at a job that waits
    # 0: off. Else each job's wait_per_dollar is at most the bar that this share of the
    # jobs that waited over the last week passed (RecentBar): the bar follows the load
    burst_share: float = 0.0


ALWAYS = Rule(min_wait=0.0, wait_per_dollar=0.0, wait_factor=0.0)  # burst-always, a baseline
NEVER = Rule(onprem_only=True)  # never-burst, a baseline


class PendingJob(NamedTuple):  # tuples: a daemon's pass decides up to 100,000 of them
    id: str
    limit: float  # seconds
    cpus: int
    gpus: int = 0
    account: str = ""
    qos: str = ""
    partition: str = ""
    priority: float = 0.0  # Slurm's; higher first when money binds
    submit: float | None = None  # unix time; None: the wait is counted from now


class Offer(NamedTuple):
    """The cheapest way to run a job in the cloud: its node group, node count, size."""

    group: str
    nodes: int
    price_per_hour: float  # for all the job's nodes
    boot: float  # seconds from launch to the job running

    def cost(self, seconds: float) -> float:
        """Dollars for the job's nodes over ``seconds`` of run plus the boot."""
        return self.price_per_hour * (self.boot + seconds) / 3600


class DataMove(NamedTuple):
    """A job's staged data as the policy counts it: ``seconds`` before the job can start
    in the cloud (its data still to cross the site's link), ``cost`` in dollars (sending,
    storing and pulling it), ``bytes`` still to send (for the reason)."""

    seconds: float
    cost: float
    bytes: int = 0


def data_move(
    to_send: int,
    size: int,
    nodes: int,
    mbit: float,
    upload_per_gb: float = 0.0,
    download_per_gb: float = 0.0,
    storage_per_gb_month: float = 0.0,
) -> DataMove:
    """What a job's staged data costs the burst: ``to_send`` bytes still to cross the
    site's link at ``mbit`` megabits a second (the push: sent and stored a month), and
    its whole ``size`` pulled by each of its ``nodes`` (in the cloud, each node at once:
    its time is the node's join, counted in the offer's boot)."""
    send = max(0, to_send)
    seconds = send * 8 / (mbit * 1e6) if mbit > 0 else 0.0
    cost = (send * (upload_per_gb + storage_per_gb_month)
            + max(0, size) * max(1, nodes) * download_per_gb) / GB  # fmt: skip
    return DataMove(seconds, cost, send)


class Decision(NamedTuple):
    job: str
    verdict: Verdict
    note: str = ""  # the reason, when it is not the wait's (never, budget, held)
    look_again: float | None = None  # unix time (WAIT)
    offer: Offer | None = None  # BURST
    cost: float = 0.0  # dollars at the job's time limit (BURST)
    wait: float = 0.0  # seconds: the expected (or, with no estimate, so far) on-prem wait
    threshold: float = 0.0  # seconds: the wait above which the job bursts
    estimated: bool = True  # the wait is an estimate (False: the wait so far)
    moving: float = 0.0  # seconds of the threshold that are the job's data moving

    @property
    def reason(self) -> str:
        """Why, in words (made when asked: a pass decides up to 100,000 jobs)."""
        if self.note:
            return self.note
        what = "expected on-prem wait" if self.estimated else "no on-prem estimate; waited"
        data = f" (with {_span(self.moving)} to move its data)" if self.moving else ""
        if self.verdict == Verdict.BURST:
            return (f"{what} {_span(self.wait)} > {_span(self.threshold)}{data}; "
                    f"cloud {_usd(self.cost)}")  # fmt: skip
        return f"{what} {_span(self.wait)} <= {_span(self.threshold)}{data}"

    @property
    def held(self) -> bool:
        """Slurm holds the job back (the daemon's ``Held``): not the policy's decision."""
        return False


class Job(Protocol):
    """What a decision reads of a pending job (``PendingJob``, or the daemon's queue)."""

    @property
    def id(self) -> str: ...
    @property
    def limit(self) -> float: ...  # seconds (math.inf: none)
    @property
    def account(self) -> str: ...
    @property
    def priority(self) -> float: ...
    @property
    def submit(self) -> float | None: ...


def threshold(job: Job, rule: Rule, cost: float) -> float:
    """The wait (seconds) above which the job bursts: the largest of ``min_wait``,
    ``wait_per_dollar`` x its cloud cost and ``wait_factor`` x its time limit."""
    t = rule.min_wait
    by_cost = rule.wait_per_dollar * cost
    if by_cost > t:
        t = by_cost
    by_limit = rule.wait_factor * job.limit
    return by_limit if by_limit > t else t


BURST_, WAIT_, NEVER_ = Verdict.BURST, Verdict.WAIT, Verdict.NEVER  # read 100,000 times a pass


def decide(
    job: Job,
    now: float,
    expected_start: float | None,
    offer: Offer | None,
    rule: Rule,
    money_left: float | None = None,
    data: DataMove | None = None,
) -> Decision:
    """One job's decision. The wait is the job's whole on-prem wait, from its submission
    to ``expected_start`` (``math.inf``: it can never start on-prem). ``expected_start``
    None: no estimate yet (Slurm's backfill has not reached the job); the wait so far
    counts, so the job bursts once it has waited past its threshold. ``money_left``
    None: no budget applies. ``data``: the job's staged data (None: it has none); its
    nodes are paid for while they wait for it."""
    if rule.onprem_only:
        return Decision(job.id, NEVER_, "on-prem only")
    if offer is None:
        return Decision(job.id, NEVER_, "no node group fits the job")
    cost = offer.cost(job.limit)
    moving = 0.0
    if data is not None:
        moving = data.seconds
        cost += data.cost + offer.price_per_hour * moving / 3600
    if rule.max_job_cost is not None and cost > rule.max_job_cost:
        return Decision(
            job.id, NEVER_, f"cloud cost {_usd(cost)} over the {_usd(rule.max_job_cost)} cap"
        )
    submit = job.submit
    since = now if submit is None or submit > now else submit
    if expected_start is None:
        wait = now - since
    else:
        wait = (expected_start if expected_start > now else now) - since
    limit = threshold(job, rule, cost) + moving
    if wait <= limit:
        # without an estimate the wait grows as time passes: look again when it would
        # cross the threshold, or at the next recheck (an estimate may change meanwhile)
        again = rule.recheck
        if expected_start is None and limit - wait + 1.0 < again:
            again = limit - wait + 1.0 if limit - wait > 0.0 else 1.0
        return Decision(job.id, WAIT_, "", now + again, None, 0.0, wait, limit,
                        expected_start is not None, moving)  # fmt: skip
    if money_left is not None and cost > money_left:
        return Decision(
            job.id,
            WAIT_,
            f"budget: {_usd(cost)} needed, {_usd(max(money_left, 0))} left",
            now + rule.recheck,
        )
    return Decision(job.id, BURST_, "", None, offer, cost, wait, limit,
                    expected_start is not None, moving)  # fmt: skip


def decide_all(
    jobs: Sequence[Job],
    now: float,
    expected_start: Mapping[str, float | None],
    offers: Mapping[str, Offer | None],
    rule_of: Mapping[str, Rule] | None = None,
    default: Rule = Rule(),
    budgets: Mapping[str, float] | None = None,
    spend_cap: float | None = None,
    data: Mapping[str, DataMove] | None = None,
) -> list[Decision]:
    """One pass over ``jobs``, in Slurm's priority order (highest first, then as given):
    each burst takes its cost from its account's budget and from the cluster's cap, so
    that when money binds the jobs that still burst are the ones Slurm would run first.
    ``data``: the staged data of the jobs that have some."""
    moves = data or {}
    left = dict(budgets or {})
    cap = spend_cap
    # highest priority first; the sort is stable, so then as given
    order = sorted(range(len(jobs)), key=[-j.priority for j in jobs].__getitem__)
    out: list[Decision | None] = [None] * len(jobs)
    rules = rule_of or {}
    for i in order:
        job = jobs[i]
        rule = rules.get(job.id, default)
        money = left.get(job.account)
        if cap is not None:
            money = cap if money is None else min(money, cap)
        d = decide(job, now, expected_start.get(job.id), offers.get(job.id), rule, money,
                   moves.get(job.id))  # fmt: skip
        if d.verdict is BURST_:
            if job.account in left:
                left[job.account] -= d.cost
            if cap is not None:
                cap -= d.cost
        out[i] = d
    return [d for d in out if d is not None]


class RecentBar:
    """The expected wait per dollar of the jobs that waited over the last ``window``
    seconds (or of the last ``least`` of them, where the window holds fewer: a quiet
    site keeps its bar), each counted once, at its first decision with an estimate;
    ``bar(share)`` is the value that ``share`` of them passed. With ``Rule.burst_share``
    a job's wait_per_dollar is at most the bar when it is first decided: when the
    queue's waits grow (or shrink) with the load, so does the bar, and about the same
    share of the waiting jobs bursts. Until ``least`` jobs have been seen there is no
    bar."""

    def __init__(self, window: float = 7 * 86400.0, least: int = 50) -> None:
        self.window = window
        self.least = least
        self._seen: deque[tuple[float, float]] = deque()  # (when, ratio), oldest first
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, now: float, ratio: float) -> None:
        if not math.isfinite(ratio):
            return  # a job that can never run on-prem says nothing of the queue's waits
        self._seen.append((now, ratio))
        insort(self._sorted, ratio)

    def bar(self, now: float, share: float) -> float | None:
        seen, ordered = self._seen, self._sorted
        while len(seen) > self.least and seen[0][0] < now - self.window:
            _, old = seen.popleft()
            del ordered[bisect_left(ordered, old)]
        if len(ordered) < self.least:
            return None
        return ordered[min(len(ordered) - 1, int(len(ordered) * (1.0 - share)))]

    def rule_for(
        self, job: Job, now: float, expected_start: float | None, offer: Offer | None, rule: Rule
    ) -> Rule | None:
        """The job's own rule under ``rule.burst_share``, made at its first decision with
        an estimate and kept by the caller (None: no estimate yet; ask again)."""
        if expected_start is None or offer is None:
            return None
        submit = now if job.submit is None or job.submit > now else job.submit
        cost = offer.cost(job.limit)
        ratio = (max(expected_start, now) - submit) / cost if cost > 0 else math.inf
        bar = self.bar(now, rule.burst_share)
        self.add(now, ratio)
        if bar is None or bar >= rule.wait_per_dollar:
            return rule
        return replace(rule, wait_per_dollar=bar)


def _usd(dollars: float) -> str:
    """Cents for most jobs; a cheaper one shows its fractions of a cent."""
    return f"${dollars:.2f}" if dollars >= 0.1 or dollars == 0 else f"${dollars:.4f}"


def _span(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
