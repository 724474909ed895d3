"""Chargeback: job usage in, cost split out, budgets kept in Slurm.

One pass, run by the daemon every ``ledger.ingest_interval`` seconds (and by
``slurm-burst ledger sync`` on demand), does in order:

1. **ingest**: ``sacct`` from the ledger's cursor (minus ``ingest_overlap``) to
   now, burst partitions only; jobs already recorded are skipped by key.
2. **allocate**: every terminated instance not yet split whose whole life is
   covered by ingested accounting (terminated before the cursor) is split
   among its jobs (``core.allocation``) and written with its rollups in one
   transaction; an instance is split exactly once (unique key).
3. **budgets** (every ``budget_sync_interval``): an account whose spend this
   month (the larger of the ledger's real cost, overhead included, and Slurm's
   own billing count) has reached its budget gets a ``GrpTRESMins=billing``
   limit equal to what it used plus what its running jobs hold; its new jobs
   pend with reason ``AssocGrpBillingMinutes`` and never power a node up. An
   account with money left has no limit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any

from slurm_burst.config import Fleet, LedgerConfig
from slurm_burst.core.allocation import Allocation, InstanceSpan, JobSpan, allocate
from slurm_burst.core.errors import BurstError
from slurm_burst.core.hostlist import expand
from slurm_burst.core.pricing import dollars, epoch_ms
from slurm_burst.core.usage import AssocUsage, LedgerError, LedgerUnavailable
from slurm_burst.core.warm import warm_nodes
from slurm_burst.ports import Accounting, AccountingLedger, Metrics, Scheduler, SpooledLedger
from slurm_burst.services.periodic import contain

log = logging.getLogger(__name__)

FIRST_WINDOW = timedelta(days=1)  # how far back the very first ingest reads


@dataclass(frozen=True)
class BudgetStatus:
    account: str
    period: str
    budget_micros: int
    spent_micros: int  # the ledger: allocated and overhead, this period
    committed_micros: int  # running burst jobs: remaining time limit x rate
    slurm_used_micros: int | None  # Slurm's billing-minutes this period
    slurm_limit_micros: int | None  # GrpTRESMins=billing in force

    @property
    def remaining_micros(self) -> int:
        return self.budget_micros - self.spent_micros - self.committed_micros

    def as_dict(self) -> dict[str, Any]:
        def d(v: int | None) -> float | None:
            return None if v is None else float(dollars(v))

        return {
            "account": self.account,
            "period": self.period,
            "budget": d(self.budget_micros),
            "spent": d(self.spent_micros),
            "committed": d(self.committed_micros),
            "remaining": d(self.remaining_micros),
            "slurm_used": d(self.slurm_used_micros),
            "slurm_limit": d(self.slurm_limit_micros),
            "over_budget": self.spent_micros >= self.budget_micros,
        }


def month_bounds(now: datetime) -> tuple[date, date]:
    first = date(now.year, now.month, 1)
    nxt = date(now.year + (now.month == 12), now.month % 12 + 1, 1)
    return first, nxt


@dataclass(frozen=True, kw_only=True)
class ChargebackSettings:
    """What chargeback needs of the config (wiring.ledger.chargeback_settings)."""

    fleet: Fleet  # node groups, prices (account overrides), burst partitions
    ledger: LedgerConfig  # overlap, overhead rule, site account, intervals
    spend_cap: float = 0.0  # dollars a month the burst policy may spend; 0 none


class Chargeback:
    def __init__(
        self,
        settings: ChargebackSettings,
        ledger: AccountingLedger,
        accounting: Accounting | None,
        scheduler: Scheduler | None,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self.fleet = settings.fleet
        self.settings = settings
        self.ledger = ledger
        self.accounting = accounting
        self.scheduler = scheduler
        self.clock = clock
        self.metrics = metrics
        # the all-time spend the metrics show: {(account, partition): micros}, read
        # incrementally after rollup row _spend_cursor, and whole at each budget pass
        self._spend: dict[tuple[str, str], int] = {}
        self._spend_cursor = 0
        # what the burst policy may spend: {account: dollars left}, the cap's dollars left
        self._money: tuple[dict[str, float], float | None] | None = None  # not yet known

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    # -- 1. ingest ----------------------------------------------------------------
    def ingest(self) -> tuple[int, int]:
        """Read finished burst jobs from sacct; return (seen, added)."""
        if self.accounting is None:
            return 0, 0
        end = self.now()
        cursor = self.ledger.ingest_cursor()
        start = (
            (cursor - timedelta(seconds=self.settings.ledger.ingest_overlap))
            if cursor
            else (end - FIRST_WINDOW)
        )
        jobs = self.accounting.finished_jobs(start, end, self.fleet.burst_partitions())
        added = self.ledger.record_jobs(jobs, (start, end))
        if self.metrics is not None:
            self.metrics.ledger_ingested(end.timestamp())
        log.info(
            "ledger.ingest seen=%d added=%d window_start=%s", len(jobs), added, start.isoformat()
        )
        return len(jobs), added

    # -- 2. allocate ----------------------------------------------------------------
    def allocate(self) -> int:
        """Split every closed instance whose jobs are all ingested; return how many."""
        covered = self.ledger.ingest_cursor() if self.accounting is not None else self.now()
        if covered is None:
            return 0
        closed = self.ledger.closed_unallocated(covered)
        if not closed:
            return 0
        jobs = self.ledger.jobs_between(min(c.start for c in closed), max(c.end for c in closed))
        nodes_of = lru_cache(maxsize=4096)(
            lambda expr: frozenset(expand(expr)) if expr else frozenset()
        )
        rule, site = self.settings.ledger.overhead, self.settings.ledger.site_account
        out = []
        for c in closed:
            span = InstanceSpan(
                c.instance_id,
                c.node,
                c.partition,
                epoch_ms(c.start),
                epoch_ms(c.end),
                c.micros_per_hour,
                c.cpus,
                c.gpus,
            )
            held = [
                JobSpan(
                    j.key,
                    j.account,
                    j.user,
                    epoch_ms(j.start),
                    # sacct has 1 s resolution: a job recorded as ending in the second it
                    # started ran for up to a second, and is charged for one
                    max(epoch_ms(j.end), epoch_ms(j.start) + 1000),
                    cpus=-(-j.cpus // max(1, j.node_count)),
                    gpus=-(-j.gpus // max(1, j.node_count)),
                )
                for j in jobs
                if c.node in nodes_of(j.nodes) and j.end >= c.start and j.start < c.end
            ]
            overrides = self.fleet.rate_table.account_overrides(c.size, c.gpus, c.start)
            this = "site" if self._warm_launch(c.node, c.start) else rule
            lines = allocate(span, held, rule=this, site_account=site, overrides=overrides)
            out.append(Allocation(c.instance_id, span.cost, this, lines))
        done = int(self.ledger.write_allocations(out))
        log.info("ledger.allocate instances=%d", done)
        return done

    def _warm_launch(self, node: str, start: datetime) -> bool:
        """Whether the instance is a warm pool's, launched in one of its windows (the
        controller's local time): its idle time is then the site's overhead, not its
        jobs'."""
        g = self.fleet.group_of(node)
        if g is None or not g.warm or node not in g.warm_pool():
            return False
        t = start.astimezone()
        return warm_nodes(g.warm_windows(), t.weekday(), t.hour * 60 + t.minute) > 0

    # -- 3. budgets -----------------------------------------------------------------
    def budgets(self, sync: bool = False) -> list[BudgetStatus]:
        """Each budgeted account's position this month; with ``sync``, set Slurm's limit."""
        budgets = self.ledger.budgets()
        if not budgets:  # nothing to show or enforce: no squeue, no sacctmgr
            return []
        now = self.now()
        first, nxt = month_bounds(now)
        spent = self.ledger.spent(first, nxt)
        committed = self._committed(now)
        out = []
        for account, (amount, _period, _at) in sorted(budgets.items()):
            used = limit = None
            if self.accounting is not None:
                try:
                    assoc = self.accounting.usage(account)
                    used, limit = assoc.used, assoc.limit
                    if sync:
                        limit = self._enforce(account, amount, spent.get(account, 0), assoc)
                except BurstError as exc:  # sacctmgr failing: the status says less
                    log.warning("budget.slurm_failed account=%s error=%s", account, exc)
            out.append(
                BudgetStatus(
                    account,
                    first.strftime("%Y-%m"),
                    amount,
                    spent.get(account, 0),
                    committed.get(account, 0),
                    used,
                    limit,
                )
            )
        return out

    def _enforce(self, account: str, budget: int, spent: int, assoc: AssocUsage) -> int | None:
        """Block ``account``'s new jobs in Slurm once its budget is used up; else unblock.

        Spend is the larger of the ledger's (real cost, overhead included) and
        Slurm's own billing count. An account with money left has no limit. One
        without gets ``GrpTRESMins=billing = used + running``: what its running
        jobs still hold fits, so Slurm lets them finish (it kills the jobs of an
        association whose usage reaches its limit), and any new job pends with
        ``AssocGrpBillingMinutes`` before a node is resumed for it.
        """
        over = budget - max(spent, assoc.used) <= 0
        want = assoc.used + assoc.running if over else None
        if want != assoc.limit and self.accounting is not None:
            self.accounting.set_billing_limit(account, want)
            log.info("budget.enforce account=%s over=%s limit=%s", account, over, want)
        return want

    def _committed(self, now: datetime) -> dict[str, int]:
        """Running burst jobs' remaining time limit x their billing rate (micro-dollars)."""
        parts = set(self.fleet.burst_partitions())
        out: dict[str, int] = {}
        if self.scheduler is None:
            return out
        try:
            jobs = self.scheduler.jobs()
        except BurstError as exc:
            log.warning("budget.committed_unknown error=%s", exc)
            return out
        for j in jobs:
            if j.state != "RUNNING" or j.partition not in parts or j.time_limit_min is None:
                continue
            elapsed = (now - j.start_time).total_seconds() / 60 if j.start_time else 0
            left = max(0.0, j.time_limit_min - elapsed)
            rate = _int(j.tres_allocated.get("billing"))
            out[j.account] = out.get(j.account, 0) + int(left * rate)
        return out

    # -- the daemon's loop --------------------------------------------------------------
    def pass_once(self, sync_budgets: bool) -> None:
        for name, step in (("ingest", self.ingest), ("allocate", self.allocate)):
            try:
                step()
            except LedgerUnavailable as exc:
                log.warning("ledger.%s.waiting reason=%s", name, exc)
                return
            except BurstError as exc:  # one phase failing must not stop the others
                log.error("ledger.%s.failed code=%s error=%s", name, exc.code, exc)
        if sync_budgets:
            try:
                statuses = self.budgets(sync=True)
                self.refresh_money(statuses)
                self.report_budgets(statuses)
            except LedgerError as exc:
                log.warning("budget.sync.failed error=%s", exc)
        try:
            self.report_spend(whole=sync_budgets)
        except LedgerError as exc:
            log.warning("ledger.spend_metrics.failed error=%s", exc)

    # -- the metrics --------------------------------------------------------------------
    def started(self) -> None:
        """The ledger loop starts (on the leader): until its first ingest, the ingest
        timestamp says "not since now", so a stall is counted from here."""
        if self.metrics is not None and self.accounting is not None:
            self.metrics.ledger_ingested(self.clock())

    def report_budgets(self, statuses: list[BudgetStatus]) -> None:
        if self.metrics is None:
            return
        _first, nxt = month_bounds(self.now())
        end = datetime(nxt.year, nxt.month, nxt.day, tzinfo=UTC).timestamp()
        self.metrics.budgets(
            {
                b.account: (
                    float(dollars(b.budget_micros)),
                    float(dollars(b.spent_micros)),
                    float(dollars(b.remaining_micros)),
                )
                for b in statuses
            },
            end,
        )

    def report_spend(self, whole: bool) -> None:
        """The ledger's all-time spend by account and node group, for the spend counter
        (a partition several groups share is its own label)."""
        if self.metrics is None:
            return
        last, rows = self.ledger.spend_since(0 if whole else self._spend_cursor)
        if whole:
            self._spend = {}
        for key, micros in rows.items():
            self._spend[key] = self._spend.get(key, 0) + micros
        self._spend_cursor = last
        groups_of: dict[str, list[str]] = {}
        for name, g in self.fleet.node_groups.items():
            groups_of.setdefault(g.partition, []).append(name)
        out: dict[tuple[str, str], float] = {}
        for (account, partition), micros in self._spend.items():
            names = groups_of.get(partition, [])
            key = (account, names[0] if len(names) == 1 else partition)
            out[key] = out.get(key, 0.0) + float(dollars(micros))
        self.metrics.spent(out)

    # -- 4. what the burst policy may spend ---------------------------------------------
    def money_left(self) -> tuple[dict[str, float], float | None] | None:
        """Each budgeted account's dollars left and the spend cap's (None: no cap), as of
        the last budget pass (``ledger.budget_sync_interval``); None before the first."""
        return self._money

    def refresh_money(self, statuses: list[BudgetStatus]) -> None:
        left = {b.account: float(dollars(b.remaining_micros)) for b in statuses}
        cap: float | None = None
        if self.settings.spend_cap > 0:
            first, nxt = month_bounds(self.now())
            used = sum(self.ledger.spent(first, nxt).values())
            used += sum(self._committed(self.now()).values())
            cap = self.settings.spend_cap - float(dollars(used))
        self._money = (left, cap)


class ChargebackLoop(threading.Thread):
    """The daemon's ledger thread: upgrade, replay the spool, ingest, allocate, budgets.

    Its own thread, so a slow sacct or database never delays the heartbeat or
    the hooks' requests.
    """

    def __init__(
        self, settings: LedgerConfig, chargeback: Chargeback, spooling: SpooledLedger
    ) -> None:
        super().__init__(name="ledger", daemon=True)
        self.settings = settings
        self.cb = chargeback
        self.spooling = spooling
        self.stop = threading.Event()
        self.schema_ready = False

    def run(self) -> None:
        self.cb.started()
        next_budget = 0.0
        while not self.stop.is_set():
            due = time.monotonic() >= next_budget
            if due:
                next_budget = time.monotonic() + self.settings.budget_sync_interval
            try:
                self.tick(due)
            except Exception as exc:  # boundary: the ledger thread outlives one round
                contain("ledger.pass", exc, self.cb.metrics)
            self.stop.wait(
                min(self.settings.ingest_interval, 15.0)
                if self.spooling.pending()
                else self.settings.ingest_interval
            )

    def ensure_schema(self) -> bool:
        """Upgrade the ledger schema once (under the migration lock); False while it fails."""
        if not self.schema_ready:
            try:
                self.cb.ledger.upgrade()
                self.schema_ready = True
            except LedgerError as exc:
                log.warning("ledger.upgrade.waiting reason=%s", exc)
        return self.schema_ready

    def tick(self, sync_budgets: bool) -> None:
        if not self.ensure_schema():
            return
        try:
            self.spooling.replay()
        except (BurstError, OSError) as exc:  # the spool's files unreadable
            log.error("ledger.replay.failed error=%s", exc)
        self.cb.pass_once(sync_budgets)


def _int(v: Any) -> int:
    try:
        return int(float(str(v)))
    except (TypeError, ValueError):
        return 0
