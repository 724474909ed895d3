"""The what-if simulator, pure: a job trace through a discrete-event model of the on-prem
cluster (FCFS with EASY backfill, CPUs and GPUs) plus the cloud (boot delay, prices,
node-group limits), with the burst decisions made by ``core.policy``, the code the
daemon runs.

The model, and what it leaves out:

- On-prem: one pool of ``cpus`` (and ``gpus``); a job runs when its CPUs and GPUs are
  free. The queue is in submit order; the head starts as soon as it fits; behind it,
  up to ``backfill_depth`` jobs (Slurm's ``bf_max_job_test``) may start now if they end,
  by their time limit, before the head's reservation, or fit beside it (EASY). Node
  boundaries and fair-share are not modelled.
- Cloud: a job bursts onto nodes of its own from the cheapest node group that fits it,
  if the group has room (``max_nodes``); it starts ``boot`` seconds after the decision
  and is billed, per node, for the boot and its run.
- Decisions: a pending job is decided when it arrives and when its decision says to
  look again. The expected on-prem start is the simulator's own estimate: when enough
  running jobs end, by their limits, to free the job's CPUs and GPUs (a backfill
  reservation), plus the work queued ahead of it over the pool (:class:`WorkAhead`).
  The daemon uses Slurm's backfill estimate.

Results per job (start, where, cost) and the summary figures the issue asks for: wait
(mean, median, p95), bounded slowdown (runs under 10 s count as 10 s), cloud cost,
cloud node-hours and GPU-hours, on-prem utilization.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice

from slurm_burst.core.policy import Offer, PendingJob, RecentBar, Rule, Verdict, decide
from slurm_burst.core.warm import WEEK, Window, node_seconds, seconds_until_below, week_profile
from slurm_burst.core.workload import TraceJob

BOUND = 10.0  # seconds: the bounded slowdown's floor for a job's run time
MONTH = 365.25 / 12 * 86400  # seconds: the simulator's budget period


@dataclass(frozen=True)
class CloudGroup:
    name: str
    cpus: int  # per node
    gpus: int  # per node
    price_per_hour: float  # per node
    max_nodes: int
    boot: float = 120.0  # seconds, launch to running
    warm: tuple[Window, ...] = ()  # kept joined by schedule (core.warm)

    def offer(self, cpus: int, gpus: int, nodes: int = 1) -> Offer | None:
        """The job's nodes in this group (at least ``nodes``), or None if it cannot fit.
        A job without GPUs is not offered GPU nodes: it would leave their GPUs idle."""
        if bool(gpus) != bool(self.gpus):
            return None
        nodes = max(nodes, math.ceil(cpus / self.cpus), math.ceil(gpus / self.gpus) if gpus else 1)
        if nodes > self.max_nodes:
            return None
        return Offer(self.name, nodes, nodes * self.price_per_hour, self.boot)


def cheapest(groups: Iterable[CloudGroup], cpus: int, gpus: int, nodes: int = 1) -> Offer | None:
    """The cheapest offer of ``groups`` for a job's shape (the simulator's and the
    daemon's choice of node group)."""
    offers = [o for g in groups if (o := g.offer(cpus, gpus, nodes)) is not None]
    return min(offers, key=lambda o: o.price_per_hour, default=None)


@dataclass(frozen=True)
class Setup:
    cpus: int
    gpus: int = 0
    groups: tuple[CloudGroup, ...] = ()
    rule: Rule = field(default_factory=Rule)
    rules: Mapping[str, Rule] = field(default_factory=dict)  # by account
    backfill_depth: int = 100
    week_origin: int = 0  # minute of the week (Monday 00:00 = 0, local) at trace time 0
    record_estimates: bool = False  # keep each job's expected start at its arrival
    # money, a month at a time (MONTH seconds from trace time 0): the policy's spend cap
    # for all accounts and budgets per account, in dollars; a burst commits its cost at
    # its time limit, as the daemon counts it (warm pools are not counted)
    spend_cap: float | None = None
    budgets: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Outcome:
    """Each job's fate, in trace order."""

    start: list[float]
    where: list[str]  # "onprem", a cloud group's name, or "" (could not run anywhere)
    cost: list[float]
    nodes: list[int]  # cloud nodes the job ran on (0 on-prem)
    warm: list[bool] = field(default_factory=list)  # it started on a warm node
    warm_cost: float = 0.0  # dollars: the warm pools, idle or busy
    estimate: dict[int, float] = field(default_factory=dict)  # job -> start expected on arrival
    decisions: int = 0  # the policy's decisions made (a measure of the simulator's work)

    def waits(self, jobs: Sequence[TraceJob]) -> list[float]:
        """Each job's wait, of the jobs that ran, sorted."""
        return sorted(self.start[i] - j.submit for i, j in enumerate(jobs) if self.where[i])


@dataclass(frozen=True)
class Summary:
    jobs: int
    unrunnable: int  # larger than the pool and no cloud group fits
    mean_wait: float
    median_wait: float
    p95_wait: float
    mean_bounded_slowdown: float
    burst_jobs: int
    cloud_cost: float
    cloud_node_hours: float
    cloud_gpu_hours: float
    onprem_utilization: float  # CPUs
    onprem_gpu_utilization: float = 0.0  # GPUs (0 with none on-prem)
    warm_jobs: int = 0  # jobs that started on a warm node at once
    warm_cost: float = 0.0  # dollars of cloud_cost the warm pools cost


@dataclass(frozen=True)
class Comparison:
    """One policy's result on a trace, beside burst-always and never."""

    name: str
    summary: Summary
    wait_cut: float | None  # share of burst-always's mean-wait reduction (vs never)
    cost_share: float | None  # cloud cost as a share of burst-always's
    waits: tuple[float, ...] = ()  # every job's wait, sorted (the plots' CDF)


class WorkAhead:
    """The CPU- (and GPU-) seconds of the jobs queued ahead of a job, for the
    simulator's expected start. A Fenwick tree over arrival order keeps the sums
    O(log n)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cpu = [0.0] * (n + 1)
        self.gpu = [0.0] * (n + 1)

    def add(self, i: int, cpu: float, gpu: float) -> None:
        i += 1
        n, cpus = self.n, self.cpu
        if not gpu:
            while i <= n:
                cpus[i] += cpu
                i += i & -i
            return
        gpus = self.gpu
        while i <= n:
            cpus[i] += cpu
            gpus[i] += gpu
            i += i & -i

    def before(self, i: int) -> tuple[float, float]:
        c = g = 0.0
        while i > 0:
            c += self.cpu[i]
            g += self.gpu[i]
            i -= i & -i
        return c, g


class _Sim:
    """The event loop. What makes it fast (a year of a busy cluster in seconds, whatever
    the recheck interval):

    - Running jobs are kept sorted by their end by limit, with prefix sums of their
      CPUs and GPUs rebuilt only after a change: a reservation is two bisections.
    - A backfill pass is remembered: until a job ends or leaves the queue another way,
      an arriving job is the only one that can start, so only it is tried.
    - A waiting job is not re-decided at every recheck. Its decision can turn to burst
      only when its expected start passes a time (``crit``, read from the decision):
      the reservation moves past it only when a job starts on-prem whose end by limit
      is later (ends only move reservations earlier, and the work queued ahead only
      shrinks), and time passes it when the job's CPUs are free now. So the job is
      looked at again at its first recheck after either, on the same recheck times the
      daemon would use; warm pools and a full node group wake their waiting jobs when
      a warm window opens or a cloud node frees.
    """

    ARRIVE, END_ONPREM, END_CLOUD, WARM_UP, NEW_MONTH, CHECK = range(6)

    def __init__(
        self, jobs: Sequence[TraceJob], setup: Setup, progress: Callable[[float], None] | None
    ) -> None:
        self.jobs = jobs
        self.s = setup
        self.progress = progress
        n = len(jobs)
        self.cpus = [j.cpus for j in jobs]
        self.gpus = [j.gpus for j in jobs]
        self.limit = [j.limit for j in jobs]
        shapes: dict[tuple[int, int], Offer | None] = {}
        for j in jobs:
            if (j.cpus, j.gpus) not in shapes:
                shapes[j.cpus, j.gpus] = cheapest(setup.groups, j.cpus, j.gpus)
        self.offers = [shapes[j.cpus, j.gpus] for j in jobs]
        self.caps = {g.name: g.max_nodes for g in setup.groups}
        self.out = Outcome([math.nan] * n, [""] * n, [0.0] * n, [0] * n, [False] * n)
        self.profiles = {g.name: week_profile(g.warm) for g in setup.groups if g.warm}
        self.rises = _rises(self.profiles)
        self.warm_busy = dict.fromkeys(self.profiles, 0)  # warm nodes in use, per group
        self.free_cpu, self.free_gpu = setup.cpus, setup.gpus
        self.queue: dict[int, None] = {}  # pending jobs in submit order
        self.ahead = WorkAhead(n)
        rules = (setup.rule, *setup.rules.values())  # never-burst needs no estimate
        self.estimates = setup.record_estimates or not all(r.onprem_only for r in rules)
        self.cloud_nodes = {g.name: 0 for g in setup.groups}  # nodes in use per group
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, job, number)
        self.seq = 0
        self.current = (-math.inf, self.ARRIVE, -1)  # the event being handled
        # on-prem running jobs, sorted by (end by limit, start order)
        self.r_key: list[tuple[float, int]] = []
        self.r_cpu: list[int] = []
        self.r_gpu: list[int] = []
        self.key_of: dict[int, tuple[float, int]] = {}
        self.cum: tuple[list[int], list[int]] | None = None  # prefix sums, None: stale
        # the last backfill pass: (shadow, extra CPUs, extra GPUs), None: redo it
        self.last_pass: tuple[float, int, int] | None = None
        # waiting jobs: recheck times base + k * step; the live CHECK event's number and
        # time; a heap of the times their decisions turn (crit, job, park number)
        self.lattice: dict[int, tuple[float, float]] = {}
        self.check_seq = [0] * n
        self.check_at = [math.inf] * n
        self.parks = [0] * n
        self.turns: list[tuple[float, int, int]] = []
        self.room: dict[str, list[int]] = {g.name: [] for g in setup.groups}
        self.warm_up_at = math.inf  # the pending WARM_UP event's time
        self.spent: dict[tuple[int, str | None], float] = {}  # (month, account; None: all)
        self.broke: list[int] = []  # jobs waiting for the next month's money
        self.recent = RecentBar()  # rules with a burst_share: the bar that follows the load
        self.own_rules: dict[int, Rule] = {}

    # -- events ----------------------------------------------------------------------
    def push(self, at: float, kind: int, job: int) -> int:
        """Events at one time go arrivals first (in trace order), then ends, then warm
        windows opening, then rechecks in trace order (the older job first)."""
        self.seq += 1
        heapq.heappush(self.events, (at, kind, job, self.seq))
        return self.seq

    def run(self) -> Outcome:
        jobs, events = self.jobs, self.events
        n, nxt = len(jobs), 0
        report = max(1, n // 100)
        while nxt < n or events:
            if nxt < n and (not events or jobs[nxt].submit <= events[0][0]):
                self.current = (jobs[nxt].submit, self.ARRIVE, nxt)
                self.arrive(jobs[nxt].submit, nxt)
                nxt += 1
                if self.progress is not None and nxt % report == 0:
                    self.progress(nxt / n)
                continue
            now, kind, i, seq = heapq.heappop(events)
            self.current = (now, kind, i)
            if kind == self.END_ONPREM:
                self.end_onprem(now, i)
            elif kind == self.END_CLOUD:
                self.end_cloud(now, i)
            elif kind == self.CHECK:
                if self.check_seq[i] == seq and i in self.queue:
                    self.check_seq[i], self.check_at[i] = 0, math.inf
                    self.consider(now, i)
            elif kind == self.WARM_UP:
                self.warm_up_at = math.inf
                self.wake_all(now)
            else:
                waiting, self.broke = self.broke, []
                for j in waiting:
                    self.wake(j, now)
        self._price_warm_pools()
        return self.out

    def _price_warm_pools(self) -> None:
        ran = [i for i, where in enumerate(self.out.where) if where]
        if not self.profiles or not ran or self.s.rule.onprem_only:
            return  # never-burst keeps no pool
        first = min(self.jobs[i].submit for i in ran)
        last = max(self.out.start[i] + self.jobs[i].run for i in ran)
        for g in self.s.groups:
            if g.name in self.profiles:
                seconds = node_seconds(self.profiles[g.name], first, last, self.s.week_origin)
                self.out.warm_cost += g.price_per_hour * seconds / 3600

    def arrive(self, now: float, i: int) -> None:
        fits_onprem = self.cpus[i] <= self.s.cpus and self.gpus[i] <= self.s.gpus
        if not fits_onprem and self.offers[i] is None:
            return  # nowhere to run: counted as unrunnable
        self.queue[i] = None
        limit = self.limit[i]
        if self.estimates:
            self.ahead.add(i, self.cpus[i] * limit, self.gpus[i] * limit)
        if self.s.record_estimates:
            self.out.estimate[i] = self.expected_start(now, i)
        self.schedule(now, arrived=i)
        if i in self.queue:
            self.consider(now, i)

    def end_onprem(self, now: float, i: int) -> None:
        self._unrun(i)
        self.free_cpu += self.cpus[i]
        self.free_gpu += self.gpus[i]
        self.last_pass = None
        self.schedule(now)

    def end_cloud(self, now: float, i: int) -> None:
        group = self.out.where[i]
        self.cloud_nodes[group] -= self.out.nodes[i]
        if self.out.warm[i]:
            self.warm_busy[group] -= self.out.nodes[i]
        waiting, self.room[group] = self.room[group], []
        if group in self.profiles:
            self.wake_all(now)  # a warm node (or room in the group) for anyone waiting
        for j in waiting:
            self.wake(j, now)

    def leave(self, i: int) -> None:
        """The job leaves the queue."""
        del self.queue[i]
        limit = self.limit[i]
        if self.estimates:
            self.ahead.add(i, -self.cpus[i] * limit, -self.gpus[i] * limit)
        self.lattice.pop(i, None)
        self.parks[i] += 1

    # -- on-prem: FCFS + EASY backfill ------------------------------------------------
    def _run(self, i: int, end: float, order: int) -> None:
        """Job ``i`` runs on-prem till ``end`` (by its limit); ``order`` (increasing)
        puts it after the running jobs with the same end."""
        key = (end, order)
        at = bisect_right(self.r_key, key)
        self.r_key.insert(at, key)
        self.r_cpu.insert(at, self.cpus[i])
        self.r_gpu.insert(at, self.gpus[i])
        self.key_of[i] = key
        self.cum = None

    def _unrun(self, i: int) -> None:
        at = bisect_left(self.r_key, self.key_of.pop(i))
        del self.r_key[at], self.r_cpu[at], self.r_gpu[at]
        self.cum = None

    def start_onprem(self, now: float, i: int) -> None:
        self.leave(i)
        self.free_cpu -= self.cpus[i]
        self.free_gpu -= self.gpus[i]
        end = now + self.limit[i]
        self._run(i, end, self.push(now + self.jobs[i].run, self.END_ONPREM, i))
        self.out.start[i] = now
        self.out.where[i] = "onprem"
        # waiting jobs whose expected start this can push past their turn: look again
        turns = self.turns
        while turns and turns[0][0] < end:
            _, j, park = heapq.heappop(turns)
            if park == self.parks[j]:
                self.wake(j, now)

    def schedule(self, now: float, arrived: int | None = None) -> None:
        queue = self.queue
        depth = self.s.backfill_depth
        if arrived is not None and self.last_pass is not None and len(queue) > 1:
            # nothing changed since the last pass but this arrival: only it can start
            if len(queue) - 1 <= depth:
                self.last_pass = self._backfill(now, arrived, *self.last_pass)
            return
        cpus, gpus = self.cpus, self.gpus
        while queue:
            head = next(iter(queue))
            if cpus[head] > self.free_cpu or gpus[head] > self.free_gpu:
                break
            self.start_onprem(now, head)
        if not queue:
            self.last_pass = None
            return
        head = next(iter(queue))
        if cpus[head] > self.s.cpus or gpus[head] > self.s.gpus:
            shadow, extra_cpu, extra_gpu = math.inf, self.free_cpu, self.free_gpu
        else:
            shadow, cpu, gpu = self._reservation(cpus[head], gpus[head])
            extra_cpu, extra_gpu = cpu - cpus[head], gpu - gpus[head]
        state = (shadow, extra_cpu, extra_gpu)
        # the jobs behind the head that fit in the free CPUs now (in C: a pass over a
        # long queue after every end is most of a busy trace's time)
        window = list(islice(queue, 1, depth + 1))
        sizes = list(map(cpus.__getitem__, window))
        if not sizes or min(sizes) > self.free_cpu:
            self.last_pass = state
            return
        horizon = (shadow - now) * (1 + 1e-12) + 1e-6  # the exact test is _backfill's
        short = map(horizon.__ge__, map(self.limit.__getitem__, window))
        beside = map(extra_cpu.__ge__, sizes)
        fit = list(compress(window, map(min, map(self.free_cpu.__ge__, sizes),
                                        map(max, short, beside))))  # fmt: skip
        started = False
        for i in fit:
            if cpus[i] <= self.free_cpu:  # (earlier starts of this pass took CPUs)
                state = self._backfill(now, i, *state)
                started = started or i not in queue
        self.last_pass = None if started else state

    def _backfill(
        self, now: float, i: int, shadow: float, extra_cpu: int, extra_gpu: int
    ) -> tuple[float, int, int]:
        """Start job ``i`` beside the head if it fits now and ends (by its limit) before
        the head's reservation or fits in what the reservation leaves over."""
        c, g = self.cpus[i], self.gpus[i]
        if c > self.free_cpu or g > self.free_gpu:
            return shadow, extra_cpu, extra_gpu
        if now + self.limit[i] <= shadow:
            self.start_onprem(now, i)
        elif c <= extra_cpu and g <= extra_gpu:
            extra_cpu -= c
            extra_gpu -= g
            self.start_onprem(now, i)
        return shadow, extra_cpu, extra_gpu

    def _reservation(self, cpus: int, gpus: int) -> tuple[float, int, int]:
        """When ``cpus`` and ``gpus`` are free, running jobs ending by their limits (as
        a backfill reservation is made), and the CPUs and GPUs free then; inf when the
        running jobs never free enough (the job is larger than the pool)."""
        cpu, gpu = self.free_cpu, self.free_gpu
        if cpu >= cpus and gpu >= gpus:
            return 0.0, cpu, gpu
        if self.cum is None:
            self.cum = (list(accumulate(self.r_cpu, initial=cpu))[1:],
                        list(accumulate(self.r_gpu, initial=gpu))[1:])  # fmt: skip
        by_cpu, by_gpu = self.cum
        k = bisect_left(by_cpu, cpus)
        if gpus > gpu:
            k = max(k, bisect_left(by_gpu, gpus))
        if k >= len(by_cpu):
            return math.inf, by_cpu[-1] if by_cpu else cpu, by_gpu[-1] if by_gpu else gpu
        return self.r_key[k][0], by_cpu[k], by_gpu[k]

    # -- the policy ------------------------------------------------------------------
    def expected_start(self, now: float, i: int) -> float:
        """When the job would start on-prem: when enough of the running jobs have ended
        (by their limits) to free its CPUs and GPUs, as a backfill reservation is
        made, plus the work queued ahead of it spread over the pool."""
        free_at, queued = self._expected(now, i)
        return free_at + queued

    def _expected(self, now: float, i: int) -> tuple[float, float]:
        """The job's expected start in two parts: when its CPUs and GPUs are free (not
        before ``now``; inf: never on-prem), and the queued work's share."""
        cpus, gpus = self.cpus[i], self.gpus[i]
        if cpus > self.s.cpus or gpus > self.s.gpus:
            return math.inf, 0.0  # never on-prem
        free_at = now
        if self.free_cpu < cpus or self.free_gpu < gpus:
            free_at = self._reservation(cpus, gpus)[0]
        q_cpu, q_gpu = self.ahead.before(i)
        queued = q_cpu / self.s.cpus if cpus else 0.0
        if gpus and self.s.gpus:
            queued = max(queued, q_gpu / self.s.gpus)
        return max(free_at, now), queued

    def wake(self, i: int, at: float) -> None:
        """Look at waiting job ``i`` again at its first recheck from ``at`` on."""
        lattice = self.lattice.get(i)
        if lattice is None:
            return
        base, step = lattice
        k = max(1, math.ceil((at - base) / step)) if step > 0 else 1
        when = base + k * step
        if when == at and (when, self.CHECK, i) < self.current:
            when += step  # its look at this time is behind us (it saw what it would)
        if when < self.check_at[i]:
            self._look(i, when)

    def _look(self, i: int, when: float) -> None:
        """Job ``i``'s next look is at ``when`` (an earlier CHECK of it goes stale)."""
        self.check_seq[i] = self.push(when, self.CHECK, i)
        self.check_at[i] = when

    def wake_all(self, now: float) -> None:
        for i in list(self.lattice):
            self.wake(i, now)

    def wait(self, now: float, i: int, step: float, turn: float) -> None:
        """Job ``i`` waits: its rechecks are ``now + k * step``; its decision can turn
        to burst once its expected start passes ``turn`` (inf: only by a change)."""
        self.lattice[i] = (now, step)
        self.parks[i] += 1
        if turn < math.inf:
            turn -= 1e-6 + 1e-9 * abs(turn)  # rounding: rather too early than late
            k = max(1, math.floor((turn - now) / step) + 1) if step > 0 else 1
            self._look(i, now + k * step)
            heapq.heappush(self.turns, (turn, i, self.parks[i]))
            if len(self.turns) > 64 + 4 * len(self.lattice):  # drop the stale entries
                self.turns = [t for t in self.turns if t[2] == self.parks[t[1]]]
                heapq.heapify(self.turns)
        if self.profiles and self.warm_up_at == math.inf:
            self.warm_up_at = _next_rise(self.rises, now, self.s.week_origin)
            if self.warm_up_at < math.inf:
                self.push(self.warm_up_at, self.WARM_UP, -1)

    def _warm(self, now: float, i: int) -> bool:
        """Start the job at once on idle warm nodes, if a group has enough: they are
        paid for already (the job pays for what it runs past the window)."""
        job = self.jobs[i]
        for g in sorted(self.s.groups, key=lambda g: g.price_per_hour):
            profile = self.profiles.get(g.name)
            offer = g.offer(job.cpus, job.gpus) if profile else None
            if profile is None or offer is None:
                continue
            minute = int((now // 60 + self.s.week_origin) % WEEK)
            level = self.warm_busy[g.name] + offer.nodes
            if level > profile[minute] or self.cloud_nodes[g.name] + offer.nodes > g.max_nodes:
                continue
            past = job.run - seconds_until_below(profile, now, self.s.week_origin, level)
            self.warm_busy[g.name] = level
            self.cloud_nodes[g.name] += offer.nodes
            self.leave(i)
            self.out.start[i] = now
            self.out.where[i] = g.name
            self.out.cost[i] = offer.price_per_hour * max(0.0, past) / 3600
            self.out.nodes[i] = offer.nodes
            self.out.warm[i] = True
            self.push(now + job.run, self.END_CLOUD, i)
            return True
        return False

    def consider(self, now: float, i: int) -> None:
        job = self.jobs[i]
        self.lattice.pop(i, None)
        rule = self.s.rules.get(job.account, self.s.rule)
        if self.profiles and not rule.onprem_only and self._warm(now, i):
            self.last_pass = None
            self.schedule(now)  # the head may have gone
            return
        offer = self.offers[i]
        if rule.onprem_only or offer is None:
            return  # decide() says never, and it stays so: no estimate needed
        pending = PendingJob(str(i), job.limit, job.cpus, job.gpus, job.account, submit=job.submit)
        free_at, queued = self._expected(now, i)
        if rule.burst_share > 0:  # its own bar, set at its first decision (then fixed)
            own = self.own_rules.get(i)
            if own is None:
                own = self.own_rules[i] = (
                    self.recent.rule_for(pending, now, free_at + queued, offer, rule) or rule
                )
            rule = own
        month = int(now // MONTH)
        money = self._money(month, job.account)
        d = decide(pending, now, free_at + queued, offer, rule, money)
        self.out.decisions += 1
        step = (d.look_again or now + rule.recheck) - now
        if d.verdict == Verdict.WAIT and d.note:  # no money left this month
            self.wait(now, i, step, math.inf)
            if not self.broke:
                self.push((month + 1) * MONTH, self.NEW_MONTH, -1)
            self.broke.append(i)
        elif d.verdict == Verdict.WAIT and d.look_again is not None:
            # its wait grows with free_at alone: it bursts once free_at passes the turn
            self.wait(now, i, step, free_at + d.threshold - d.wait)
        elif d.verdict == Verdict.BURST and d.offer is not None:
            group = d.offer.group
            if self.cloud_nodes[group] + d.offer.nodes > self.caps[group]:
                self.wait(now, i, rule.recheck, math.inf)  # no room: when a node frees
                self.room[group].append(i)
                return
            self.cloud_nodes[group] += d.offer.nodes
            if money is not None:
                for key in ((month, None), (month, job.account)):
                    self.spent[key] = self.spent.get(key, 0.0) + d.cost
            self.leave(i)
            self.out.start[i] = now + d.offer.boot
            self.out.where[i] = group
            self.out.cost[i] = d.offer.cost(job.run)
            self.out.nodes[i] = d.offer.nodes
            self.push(now + d.offer.boot + job.run, self.END_CLOUD, i)
            self.last_pass = None
            self.schedule(now)  # the head may have gone

    def _money(self, month: int, account: str) -> float | None:
        """Dollars left this month to a job of ``account`` (None: no limit applies)."""
        left = None
        if self.s.spend_cap is not None:
            left = self.s.spend_cap - self.spent.get((month, None), 0.0)
        budget = self.s.budgets.get(account)
        if budget is not None:
            own = budget - self.spent.get((month, account), 0.0)
            left = own if left is None else min(left, own)
        return left


def _rises(profiles: Mapping[str, list[int]]) -> list[int]:
    """The minutes of the week at which some warm pool grows (its idle nodes may take
    a waiting job)."""
    return sorted({m for p in profiles.values() for m in range(WEEK) if p[m] > p[m - 1]})


def _next_rise(rises: list[int], now: float, origin: int) -> float:
    """The trace time of the next minute in ``rises`` after ``now`` (inf: none)."""
    if not rises:
        return math.inf
    minute = int(now // 60)  # the trace's minute; its minute of the week is + origin
    week_minute = (minute + origin) % WEEK
    at = bisect_right(rises, week_minute)
    ahead = rises[at] - week_minute if at < len(rises) else rises[0] + WEEK - week_minute
    return (minute + ahead) * 60.0


def simulate(
    jobs: Sequence[TraceJob], setup: Setup, progress: Callable[[float], None] | None = None
) -> Outcome:
    """Each job's fate; ``progress`` is told the share of jobs that have arrived, every
    hundredth."""
    if setup.cpus < 1:
        raise ValueError("the on-prem pool needs at least one CPU")
    return _Sim(jobs, setup, progress).run()


def summarize(jobs: Sequence[TraceJob], out: Outcome, setup: Setup) -> Summary:
    ran = [i for i in range(len(jobs)) if out.where[i]]
    waits = out.waits(jobs)
    slow = [
        max(1.0, (out.start[i] - jobs[i].submit + jobs[i].run) / max(jobs[i].run, BOUND))
        for i in ran
    ]
    cloud = [i for i in ran if out.where[i] != "onprem"]
    groups = {g.name: g for g in setup.groups}
    node_hours = gpu_hours = 0.0
    for i in cloud:
        hours = (groups[out.where[i]].boot + jobs[i].run) / 3600
        node_hours += out.nodes[i] * hours
        gpu_hours += jobs[i].gpus * hours
    onprem = [i for i in ran if out.where[i] == "onprem"]
    util = gpu_util = 0.0
    if onprem:
        first = min(jobs[i].submit for i in ran)
        span = max(max(out.start[i] + jobs[i].run for i in ran) - first, 1.0)
        util = sum(jobs[i].cpus * jobs[i].run for i in onprem) / (setup.cpus * span)
        if setup.gpus:
            gpu_util = sum(jobs[i].gpus * jobs[i].run for i in onprem) / (setup.gpus * span)
    return Summary(
        jobs=len(jobs),
        unrunnable=len(jobs) - len(ran),
        mean_wait=sum(waits) / len(waits) if waits else 0.0,
        median_wait=_quantile(waits, 0.5),
        p95_wait=_quantile(waits, 0.95),
        mean_bounded_slowdown=sum(slow) / len(slow) if slow else 0.0,
        burst_jobs=len(cloud),
        cloud_cost=sum(out.cost) + out.warm_cost,
        cloud_node_hours=node_hours,
        cloud_gpu_hours=gpu_hours,
        onprem_utilization=util,
        onprem_gpu_utilization=gpu_util,
        warm_jobs=sum(out.warm),
        warm_cost=out.warm_cost,
    )


def shares(s: Summary, never: Summary, always: Summary) -> tuple[float | None, float | None]:
    """``s``'s share of burst-always's mean-wait cut (from never-burst's; None: always
    cuts nothing) and its cloud cost as a share of always's (None: always costs nothing)."""
    cut = never.mean_wait - always.mean_wait
    return (
        (never.mean_wait - s.mean_wait) / cut if cut > 0 else None,
        s.cloud_cost / always.cloud_cost if always.cloud_cost > 0 else None,
    )


def _quantile(values: Sequence[float], q: float) -> float:
    """``values`` sorted; the nearest-rank quantile."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]
