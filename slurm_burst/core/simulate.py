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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from slurm_burst.core.policy import Offer, PendingJob, Rule, Verdict, decide
from slurm_burst.core.warm import WEEK, Window, node_seconds, seconds_until_below, week_profile
from slurm_burst.core.workload import TraceJob

BOUND = 10.0  # seconds: the bounded slowdown's floor for a job's run time


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
        while i <= self.n:
            self.cpu[i] += cpu
            self.gpu[i] += gpu
            i += i & -i

    def before(self, i: int) -> tuple[float, float]:
        c = g = 0.0
        while i > 0:
            c += self.cpu[i]
            g += self.gpu[i]
            i -= i & -i
        return c, g


class _Sim:
    def __init__(self, jobs: Sequence[TraceJob], setup: Setup) -> None:
        self.jobs = jobs
        self.s = setup
        n = len(jobs)
        self.out = Outcome([math.nan] * n, [""] * n, [0.0] * n, [0] * n, [False] * n)
        self.profiles = {g.name: week_profile(g.warm) for g in setup.groups if g.warm}
        self.warm_busy = dict.fromkeys(self.profiles, 0)  # warm nodes in use, per group
        self.free_cpu, self.free_gpu = setup.cpus, setup.gpus
        self.queue: dict[int, None] = {}  # pending jobs in submit order
        self.running: dict[int, float] = {}  # on-prem: job -> end by its limit
        self.ahead = WorkAhead(n)
        self.cloud_nodes = {g.name: 0 for g in setup.groups}  # nodes in use per group
        self.events: list[tuple[float, int, int, int]] = []  # (time, order, kind, job)
        self.seq = 0

    # -- events ----------------------------------------------------------------------
    ARRIVE, END_ONPREM, END_CLOUD, CHECK = range(4)

    def push(self, at: float, kind: int, job: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, job))

    def run(self) -> Outcome:
        for i, j in enumerate(self.jobs):
            self.push(j.submit, self.ARRIVE, i)
        while self.events:
            now, _, kind, i = heapq.heappop(self.events)
            if kind == self.ARRIVE:
                self.arrive(now, i)
            elif kind == self.END_ONPREM:
                self.end_onprem(now, i)
            elif kind == self.END_CLOUD:
                self.cloud_nodes[self.out.where[i]] -= self.out.nodes[i]
                if self.out.warm[i]:
                    self.warm_busy[self.out.where[i]] -= self.out.nodes[i]
            elif i in self.queue:
                self.consider(now, i)
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
        job = self.jobs[i]
        fits_onprem = job.cpus <= self.s.cpus and job.gpus <= self.s.gpus
        if not fits_onprem and self._offer(i) is None:
            return  # nowhere to run: counted as unrunnable
        self.queue[i] = None
        self.ahead.add(i, job.cpus * job.limit, job.gpus * job.limit)
        if self.s.record_estimates:
            self.out.estimate[i] = self.expected_start(now, i)
        self.schedule(now)
        if i in self.queue:
            self.consider(now, i)

    def end_onprem(self, now: float, i: int) -> None:
        job = self.jobs[i]
        del self.running[i]
        self.free_cpu += job.cpus
        self.free_gpu += job.gpus
        self.schedule(now)

    # -- on-prem: FCFS + EASY backfill ------------------------------------------------
    def _fits(self, i: int) -> bool:
        j = self.jobs[i]
        return j.cpus <= self.free_cpu and j.gpus <= self.free_gpu

    def start_onprem(self, now: float, i: int) -> None:
        job = self.jobs[i]
        del self.queue[i]
        self.ahead.add(i, -job.cpus * job.limit, -job.gpus * job.limit)
        self.free_cpu -= job.cpus
        self.free_gpu -= job.gpus
        end = now + job.limit
        self.running[i] = end
        self.out.start[i] = now
        self.out.where[i] = "onprem"
        self.push(now + job.run, self.END_ONPREM, i)

    def schedule(self, now: float) -> None:
        while self.queue:
            head = next(iter(self.queue))
            if not self._fits(head):
                break
            self.start_onprem(now, head)
        if not self.queue:
            return
        head = next(iter(self.queue))
        hj = self.jobs[head]
        if hj.cpus > self.s.cpus or hj.gpus > self.s.gpus:
            shadow, extra_cpu, extra_gpu = math.inf, self.free_cpu, self.free_gpu
        else:
            shadow, cpu, gpu = self._reservation(hj.cpus, hj.gpus)
            extra_cpu, extra_gpu = cpu - hj.cpus, gpu - hj.gpus
        for i in list(islice(self.queue, 1, self.s.backfill_depth + 1)):
            job = self.jobs[i]
            if not self._fits(i):
                continue
            if now + job.limit <= shadow:
                self.start_onprem(now, i)
            elif job.cpus <= extra_cpu and job.gpus <= extra_gpu:
                extra_cpu -= job.cpus
                extra_gpu -= job.gpus
                self.start_onprem(now, i)

    def _reservation(self, cpus: int, gpus: int) -> tuple[float, int, int]:
        """When ``cpus`` and ``gpus`` are free, running jobs ending by their limits (as
        a backfill reservation is made), and the CPUs and GPUs free then; inf when the
        running jobs never free enough (the job is larger than the pool)."""
        cpu, gpu = self.free_cpu, self.free_gpu
        if cpu >= cpus and gpu >= gpus:
            return 0.0, cpu, gpu
        for j, end in sorted(self.running.items(), key=lambda kv: kv[1]):
            cpu += self.jobs[j].cpus
            gpu += self.jobs[j].gpus
            if cpu >= cpus and gpu >= gpus:
                return end, cpu, gpu
        return math.inf, cpu, gpu

    # -- the policy ------------------------------------------------------------------
    def _offer(self, i: int) -> Offer | None:
        job = self.jobs[i]
        return cheapest(self.s.groups, job.cpus, job.gpus)

    def expected_start(self, now: float, i: int) -> float:
        """When the job would start on-prem: when enough of the running jobs have ended
        (by their limits) to free its CPUs and GPUs, as a backfill reservation is
        made, plus the work queued ahead of it spread over the pool."""
        job = self.jobs[i]
        if job.cpus > self.s.cpus or job.gpus > self.s.gpus:
            return math.inf  # never on-prem
        free_at = now
        if self.free_cpu < job.cpus or self.free_gpu < job.gpus:
            free_at = self._reservation(job.cpus, job.gpus)[0]
        q_cpu, q_gpu = self.ahead.before(i)
        queued = q_cpu / self.s.cpus if job.cpus else 0.0
        if job.gpus and self.s.gpus:
            queued = max(queued, q_gpu / self.s.gpus)
        return max(free_at, now) + queued

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
            del self.queue[i]
            self.ahead.add(i, -job.cpus * job.limit, -job.gpus * job.limit)
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
        rule = self.s.rules.get(job.account, self.s.rule)
        if self.profiles and not rule.onprem_only and self._warm(now, i):
            self.schedule(now)  # the head may have gone
            return
        offer = self._offer(i)
        pending = PendingJob(str(i), job.limit, job.cpus, job.gpus, job.account, submit=job.submit)
        d = decide(pending, now, self.expected_start(now, i), offer, rule)
        if d.verdict == Verdict.WAIT and d.look_again is not None:
            self.push(d.look_again, self.CHECK, i)
        elif d.verdict == Verdict.BURST and d.offer is not None:
            group = d.offer.group
            cap = next(g.max_nodes for g in self.s.groups if g.name == group)
            if self.cloud_nodes[group] + d.offer.nodes > cap:  # no room: look again later
                self.push(now + rule.recheck, self.CHECK, i)
                return
            self.cloud_nodes[group] += d.offer.nodes
            del self.queue[i]
            self.ahead.add(i, -job.cpus * job.limit, -job.gpus * job.limit)
            self.out.start[i] = now + d.offer.boot
            self.out.where[i] = group
            self.out.cost[i] = d.offer.cost(job.run)
            self.out.nodes[i] = d.offer.nodes
            self.push(now + d.offer.boot + job.run, self.END_CLOUD, i)
            self.schedule(now)  # the head may have gone


def simulate(jobs: Sequence[TraceJob], setup: Setup) -> Outcome:
    if setup.cpus < 1:
        raise ValueError("the on-prem pool needs at least one CPU")
    return _Sim(jobs, setup).run()


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


def _quantile(values: Sequence[float], q: float) -> float:
    """``values`` sorted; the nearest-rank quantile."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]
