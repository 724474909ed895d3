"""The simulator as it was before it was made fast (issue 33): a literal reading of the
model, every waiting job re-decided at every recheck and the running jobs sorted for
each reservation. Slow, and kept only as the reference the fast one is checked against
(test_simulate_fast.py): the same outcome, job for job, on random traces. Events at one
time go in the fast simulator's order (arrivals, ends, rechecks by trace order)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from itertools import islice

from slurm_burst.core.policy import Offer, PendingJob, Verdict, decide
from slurm_burst.core.simulate import Outcome, Setup, WorkAhead, cheapest
from slurm_burst.core.warm import WEEK, node_seconds, seconds_until_below, week_profile
from slurm_burst.core.workload import TraceJob


class ReferenceSim:
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
        heapq.heappush(self.events, (at, kind, job, self.seq))

    def run(self) -> Outcome:
        for i, j in enumerate(self.jobs):
            self.push(j.submit, self.ARRIVE, i)
        while self.events:
            now, kind, i, _ = heapq.heappop(self.events)
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


def simulate_reference(jobs: Sequence[TraceJob], setup: Setup) -> Outcome:
    if setup.cpus < 1:
        raise ValueError("the on-prem pool needs at least one CPU")
    return ReferenceSim(jobs, setup).run()
