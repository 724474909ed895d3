"""The burst policy in the daemon: which pending on-prem jobs go to the cloud, and when.

With ``policy.enabled``, every ``policy.interval`` seconds the leader's policy thread

1. reads Slurm's pending queue (one ``squeue``): each job's request, its partitions,
   its submit time and Slurm's backfill estimate of its start;
2. takes the jobs that may burst: pending in an on-prem partition
   (``slurm.onprem_partitions``), in none of the burst partitions, and waiting only for
   resources or priority (a held job, or one waiting for a dependency, is left alone);
3. decides those that are due (new, or whose last "wait" said to look again now) with
   ``core.policy.decide_all``: the cheapest node group that fits each job, the rule
   for its account, QOS and partition, the accounts' budgets and the spend cap left
   (from the ledger thread's last budget pass);
4. adds the chosen group's burst partition to each "burst" job's partition list and
   says so in its AdminComment: one ``scontrol update`` per partition list and up to
   1,000 jobs. Slurm then starts the job where it can start first; powered-down cloud
   nodes are available at once, so it resumes them and the job runs there.

Decisions are events (``job.burst``, ``job.never``) and, for ``slurm-burst jobs``, a
summary in the state database. Slurm enforces on-prem-only accounts and QOS by
itself (``conf render``'s DenyAccounts/DenyQos on burst partitions); the policy
never steers them either.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from slurm_burst.config import PolicyConfig
from slurm_burst.core.errors import BurstError
from slurm_burst.core.numbers import json_count
from slurm_burst.core.policy import (
    DataMove,
    Decision,
    Offer,
    RecentBar,
    Rule,
    Verdict,
    data_move,
    decide_all,
)
from slurm_burst.core.records import StageRecord, StageState, StoreError
from slurm_burst.core.simulate import CloudGroup, cheapest
from slurm_burst.core.slurm import QueuedJob, parse_time_limit
from slurm_burst.ports import Clock, JobSteering, Metrics, NodeStore
from slurm_burst.services.periodic import every
from slurm_burst.services.transfers import StorePrices

log = logging.getLogger(__name__)

# A pending job waiting for these may burst; any other reason (held, a dependency, a
# begin time, an association limit) is not the queue's doing.
ELIGIBLE_REASONS = frozenset({"Priority", "Resources", "None", "ReqNodeNotAvail"})
MISSING = object()
SHOWN = 1000  # decisions kept for `slurm-burst jobs` (bursts and nevers first)
# budgets left by account and the spend cap left (None: no cap); None: not known yet
Money = Callable[[], tuple[dict[str, float], float | None] | None]


class Held(Decision):
    """A pending on-prem job that Slurm holds back (a hold, a dependency, a limit)."""

    __slots__ = ()

    @property
    def held(self) -> bool:
        return True


@dataclass
class PolicyReport:
    at: float
    seconds: float = 0.0
    pending: int = 0  # pending jobs in Slurm
    eligible: int = 0  # of them, jobs the policy may send
    decided: int = 0  # of them, decided this pass (the others wait to be looked at again)
    verdicts: dict[str, int] = field(default_factory=dict)
    steered: int = 0  # jobs given a burst partition
    complaints: list[str] = field(default_factory=list)
    slurm_calls: int = 0
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class PolicySettings:
    """What the burst policy needs of the config (wiring.daemon.policy_settings)."""

    policy: PolicyConfig  # its rules (PolicyConfig.rule), interval, recheck, groups
    partition_of: Mapping[str, str]  # node group -> its burst partition
    max_time: Mapping[str, str]  # node group -> its partition's MaxTime ('' none)
    onprem: frozenset[str]  # the on-prem partitions a job may be steered from
    burst: frozenset[str]  # the burst partitions
    # staged data: the link's megabits a second (0: not counted) and the store's prices
    data_mbit: float = 0.0
    data_prices: StorePrices | None = None


class BurstPolicy:
    def __init__(
        self,
        settings: PolicySettings,
        slurm: JobSteering,
        store: NodeStore,
        clock: Clock,
        groups: Sequence[CloudGroup],
        money: Money | None = None,
        stop: threading.Event | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.policy = settings.policy
        self.metrics = metrics
        self.slurm = slurm
        self.store = store
        self.clock = clock
        allowed = set(self.policy.groups) or {g.name for g in groups}
        self.groups = [g for g in groups if g.name in allowed]
        self.partition_of = dict(settings.partition_of)
        self.max_time = {g: _seconds(t) for g, t in settings.max_time.items()}
        self.money = money
        self.stop = stop or threading.Event()
        self.onprem = settings.onprem
        self.burst = settings.burst
        self.data_mbit = settings.data_mbit
        self.data_prices = settings.data_prices
        self._moving: dict[str, StageRecord] = {}  # job -> its stage, data not on nodes yet
        self.look_again: dict[str, float] = {}  # job -> when its next look is due
        self._ours: dict[tuple[str, ...], str] = {}  # partition list -> its on-prem one
        self._rules: dict[tuple[str, str, str], Rule] = {}
        self._recent = RecentBar()  # burst_share: the waiting jobs' wait per dollar, a week
        self._own: dict[str, Rule] = {}  # job -> its rule under burst_share
        self._closed: set[str] = set()  # protected node groups, this pass
        self.last: dict[str, Decision] = {}  # job -> its last decision (pending jobs)
        self._thread: threading.Thread | None = None

    # -- the thread -------------------------------------------------------------------
    def start(self) -> None:
        if not self.policy.enabled:
            return
        self._thread = threading.Thread(target=self._loop, name="burst-policy", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        every(self.policy.interval, self.stop, self.clock, self.pass_once, "policy.pass",
              self.metrics)  # fmt: skip

    # -- one pass ---------------------------------------------------------------------
    def pass_once(self) -> PolicyReport:
        """One pass. The cyclic garbage collector is paused meanwhile: the pass makes
        hundreds of thousands of tuples and no cycles, and collecting as they are made
        would cost it an eighth of its CPU."""
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._pass()
        finally:
            if paused:
                gc.enable()

    def _pass(self) -> PolicyReport:
        now = self.clock.now()
        started = self.clock.monotonic()
        report = PolicyReport(at=now)
        try:
            queue = self.slurm.pending_jobs()
            report.slurm_calls += 1
        except BurstError as exc:  # Slurm away: nothing decided, the next pass reads again
            report.error = f"reading the queue: {exc}"
            log.warning("policy.read_failed error=%s", exc)
            self._save(report)
            return report
        money = self.money() if self.money is not None else ({}, None)
        if money is None:  # fail closed: no burst before the ledger has said what is left
            report.error = "waiting for the ledger's first budget pass"
            self._save(report)
            return report
        report.pending = len(queue)
        eligible, held = self._sort_out(queue)
        report.eligible = len(eligible)
        eligible_ids, held_ids = {j.id for j in eligible}, {j.id for j in held}
        queued_ids = {j.id for j in queue}
        for gone in [k for k in self.look_again if k not in eligible_ids]:
            del self.look_again[gone]
        if self._own:  # burst_share: forget the bars of jobs that left the queue
            self._own = {k: v for k, v in self._own.items() if k in eligible_ids}
        for gone in [
            k for k, d in self.last.items() if k not in queued_ids or (d.held and k not in held_ids)
        ]:
            del self.last[gone]  # gone (a steered job is shown till it starts), or released
        for j in held:  # on-prem jobs that Slurm itself holds back, with Slurm's reason
            text = f"Slurm holds it: {j.reason}"
            cur = self.last.get(j.id)
            if cur is None or cur.note != text:
                self.last[j.id] = Held(j.id, Verdict.WAIT, text)
        due = [j for j in eligible if self.look_again.get(j.id, 0.0) <= now]
        report.decided = len(due)
        decisions = self._decide(due, now, *money)
        steer: dict[tuple[str, ...], list[str]] = defaultdict(list)
        events: list[tuple[str, str]] = []
        report.verdicts = _count(decisions)
        recheck = now + self.policy.recheck
        last, look_again = self.last, self.look_again
        for job, d in zip(due, decisions, strict=True):  # decide_all keeps the order
            before = last.get(d.job)
            last[d.job] = d
            if d.verdict is Verdict.WAIT:
                look_again[d.job] = d.look_again or recheck
                continue
            look_again[d.job] = recheck  # a never, or a burst Slurm refused: looked at again
            if d.verdict is Verdict.BURST and d.offer is not None:
                target = self.partition_of[d.offer.group]
                steer[(*job.partitions, target)].append(d.job)
            if before is None or before.verdict != d.verdict:
                events.append((f"job.{d.verdict.value}", f"job {d.job}: {d.reason}"))
        self._events(now, events)
        for partitions, ids in sorted(steer.items()):
            stamp = self._stamp(now)
            comment = f"slurm-burst: sent to {partitions[-1]} {stamp} (slurm-burst jobs)"
            try:
                said = self.slurm.steer_jobs(ids, partitions, comment)
            except BurstError as exc:
                report.complaints.append(str(exc)[:300])
                log.warning("policy.steer_failed jobs=%d error=%s", len(ids), exc)
                continue
            finally:
                report.slurm_calls += 1
            report.steered += len(ids)
            report.complaints.extend(s[:300] for s in said[:20])
            log.info("policy.steered jobs=%d partitions=%s", len(ids), ",".join(partitions))
        report.seconds = self.clock.monotonic() - started
        self._save(report)
        return report

    def _events(self, now: float, events: list[tuple[str, str]]) -> None:
        """The pass's decisions as events, one transaction (the store is not held while
        deciding)."""
        if not events:
            return
        try:
            with self.store.atomically():
                for kind, detail in events:
                    self.store.event(now, kind, "", detail)
        except StoreError as exc:  # the decisions stand; their record is what is lost
            log.warning("policy.events_failed count=%d error=%s", len(events), exc)

    def _sort_out(self, queue: list[QueuedJob]) -> tuple[list[QueuedJob], list[QueuedJob]]:
        """The jobs the policy may send (pending in an on-prem partition of ours and in no
        burst partition, for resources or priority), and those Slurm holds back."""
        eligible: list[QueuedJob] = []
        held: list[QueuedJob] = []
        home = self._kept_home()
        for j in queue:
            if self._onprem_of(j.partitions):
                ok = j.reason in ELIGIBLE_REASONS and j.id not in home
                (eligible if ok else held).append(j)
        return eligible, held

    def _kept_home(self) -> set[str]:
        """Jobs whose staged data may not leave, or is not yet cleared to (stage-in checks
        it as the job's user): the policy never sends them (docs/staging.md). The others
        with a stage are kept for their data's move (``_data``)."""
        try:
            stages = self.store.stages()
        except StoreError as exc:  # not knowing which: this pass sends nothing
            log.warning("policy.stages_unread error=%s", exc)
            raise
        home: set[str] = set()
        self._moving = {}
        for s in stages:
            if s.state in _NOT_CLEARED:
                home.add(str(s.job_id))
            else:
                self._moving[str(s.job_id)] = s
        return home

    def _data(self, jobs: list[QueuedJob]) -> dict[str, DataMove]:
        """What moving each job's staged data takes, for the jobs that have some: a
        cleared stage (``deferred``) or one being pushed sends its whole size (at most:
        what the store holds already is not sent again), a stored one nothing; each of
        the job's nodes pulls all of it."""
        prices, moving = self.data_prices, self._moving
        if self.data_mbit <= 0 or not moving:
            return {}
        out: dict[str, DataMove] = {}
        for j in jobs:
            rec = moving.get(j.id)
            if rec is None:
                continue
            size = sum(json_count(d.get("bytes")) for d in rec.datasets)
            to_send = 0 if rec.state == StageState.STAGED else size
            out[j.id] = data_move(
                to_send, size, j.nodes, self.data_mbit,
                prices.upload_per_gb if prices else 0.0,
                prices.download_per_gb if prices else 0.0,
                prices.storage_per_gb_month if prices else 0.0,
            )  # fmt: skip
        return out

    def _onprem_of(self, partitions: tuple[str, ...]) -> str:
        """The first on-prem partition of a job's list; "" when the policy may not send it
        (none of ours, or a burst partition in it already)."""
        found = self._ours.get(partitions)
        if found is None:
            mine = [p for p in partitions if p in self.onprem]
            ok = mine and not set(partitions) & self.burst
            found = self._ours[partitions] = mine[0] if ok else ""
        return found

    def _decide(
        self, jobs: list[QueuedJob], now: float, budgets: dict[str, float], cap: float | None
    ) -> list[Decision]:
        if not jobs:
            return []
        try:
            health = self.store.groups()
        except StoreError as exc:  # not known: every group counts as open; Slurm decides
            log.warning("policy.groups_unknown error=%s", exc)
            health = {}
        self._closed = {name for name, h in health.items() if h.protected(now)}
        starts: dict[str, float | None] = {}
        offers: dict[str, Offer | None] = {}
        rules: dict[str, Rule] = {}
        cache: dict[tuple[int, int, int, float], Offer | None] = {}
        known, ours = self._rules, self._ours  # the loop runs 100,000 times: no calls in it
        owned = self._own
        for j in jobs:
            starts[j.id] = j.expected_start
            key = (j.cpus, j.gpus, j.nodes, j.limit)
            offer = cache.get(key, MISSING)
            if offer is MISSING:
                offer = cache[key] = self._offer(*key)
            offers[j.id] = offer  # type: ignore[assignment]
            which = (j.account, j.qos, ours[j.partitions])  # _sort_out filled ours
            rule = known.get(which)
            if rule is None:
                rule = known[which] = self.policy.rule(*which)
            if rule.burst_share:  # the job's own bar, set at its first estimate, then kept
                own = owned.get(j.id)
                if own is None:
                    own = self._recent.rule_for(j, now, j.expected_start, offers[j.id], rule)
                    if own is not None:
                        owned[j.id] = own
                rule = own or rule
            rules[j.id] = rule
        return decide_all(jobs, now, starts, offers, rules, budgets=budgets, spend_cap=cap,
                          data=self._data(jobs))  # fmt: skip

    def _offer(self, cpus: int, gpus: int, nodes: int, limit: float) -> Offer | None:
        """The cheapest open group that fits the job, in a partition whose MaxTime it
        fits (a protected group takes no jobs: its nodes are drained)."""
        open_ = (
            g
            for g in self.groups
            if g.name not in self._closed and limit <= self.max_time.get(g.name, math.inf)
        )
        return cheapest(open_, cpus, gpus, nodes)

    def _stamp(self, now: float) -> str:
        import time

        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))

    def _save(self, report: PolicyReport) -> None:
        """The pass and its most telling decisions, for ``slurm-burst jobs``."""
        shown: list[Decision] = []
        for verdict in (Verdict.BURST, Verdict.NEVER, Verdict.WAIT):
            if len(shown) < SHOWN:
                shown.extend(islice((d for d in self.last.values() if d.verdict is verdict),
                                    SHOWN - len(shown)))  # fmt: skip
        doc: dict[str, Any] = {
            "at": report.at,
            "seconds": round(report.seconds, 4),
            "pending": report.pending,
            "eligible": report.eligible,
            "decided": report.decided,
            "verdicts": report.verdicts,
            "steered": report.steered,
            "complaints": report.complaints[:20],
            "slurm_calls": report.slurm_calls,
            "error": report.error,
            "totals": _count(self.last.values()),
            "jobs": [_row(d, self.look_again.get(d.job)) for d in shown],
        }
        try:
            self.store.set_policy_report(doc)
        except StoreError as exc:  # the pass's work is done; only its summary is lost
            log.warning("policy.save_failed error=%s", exc)


_NOT_CLEARED = frozenset({StageState.REQUESTED, StageState.CHECKING, StageState.KEPT_HOME,
                          StageState.FAILED})  # fmt: skip


def _count(decisions: Any) -> dict[str, int]:
    return {str(v): n for v, n in Counter(d.verdict for d in decisions).items()}


def _row(d: Decision, look_again: float | None) -> dict[str, Any]:
    return {
        "job": d.job,
        "verdict": d.verdict.value,
        "reason": d.reason,
        "group": d.offer.group if d.offer else None,
        "cost": round(d.cost, 4) if d.verdict == Verdict.BURST else None,
        "look_again": look_again if d.verdict != Verdict.BURST else None,
    }


def _seconds(max_time: str) -> float:
    """A burst partition's MaxTime in seconds (``UNLIMITED``, or not understood: none)."""
    try:
        limit = parse_time_limit(max_time)
    except ValueError:
        return math.inf
    return math.inf if limit is None else limit
