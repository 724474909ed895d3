"""The daemon's Prometheus metrics (prometheus-client), on a registry of its own.

Names follow Prometheus conventions: ``slurm_burst_`` prefix, counters end in
``_total``, durations are seconds. Labels are bounded sets (groups, states,
providers, error codes), never node names or job ids; the one exception, per-GPU
series labelled by node, exists only when ``gpu.per_gpu_metrics`` asks for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from slurm_burst import __version__
from slurm_burst.core.fleetstatus import FleetStatus
from slurm_burst.core.gpu import GpuSample, GroupGpus

NODE_STATES = (
    "requested",
    "launching",
    "booting",
    "bootstrapping",
    "joined",
    "terminating",
    "terminated",
    "failed",
)

# Slurm nodes by where they are and what they do (the dashboard's on-prem vs cloud)
NODE_ACTIVITY = ("busy", "idle", "powered_down", "powering_up", "unavailable")
SIDES = ("onprem", "cloud")

JOIN_BUCKETS = (1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900, 1800)
STEP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
OTHER_ACCOUNTS = "_other"  # the spend of accounts past metrics_max_accounts, summed


class SpendCollector(Collector):
    """``slurm_burst_cloud_spend_dollars_total``: the ledger's booked spend since it began,
    by account and node group, replaced whole after each ledger pass (a counter whose
    value comes from the database, so a daemon restart or a failover does not reset it)."""

    LABELS = ("account", "group")

    def __init__(self) -> None:
        self.totals: Mapping[tuple[str, str], float] = {}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "slurm_burst_cloud_spend_dollars",
            "Cloud spend booked in the ledger since it began, by account and node group "
            "(dollars; instances are booked once their jobs' accounting is in).",
            labels=list(self.LABELS),
        )
        for (account, group), dollars in sorted(self.totals.items()):
            family.add_metric([account, group], dollars)
        yield family


class Metrics:
    """The Metrics port as Prometheus series."""

    def __init__(self, max_accounts: int = 100) -> None:
        self.max_accounts = max_accounts
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.nodes = Gauge(
            "slurm_burst_nodes",
            "Cloud nodes by node group and state.",
            ["group", "state"],
            registry=r,
        )
        self.launches = Counter(
            "slurm_burst_launches_total",
            "Instances launched, by node group, provider and size.",
            ["group", "provider", "size"],
            registry=r,
        )
        self.failures = Counter(
            "slurm_burst_launch_failures_total",
            "Node launches that failed, by node group and error code.",
            ["group", "code"],
            registry=r,
        )
        self.pass_duration = Histogram(
            "slurm_burst_reconcile_pass_duration_seconds",
            "Wall time of one reconcile pass.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.passes = Counter(
            "slurm_burst_reconcile_passes_total", "Reconcile passes run.", registry=r
        )
        self.last_pass = Gauge(
            "slurm_burst_reconcile_last_pass_timestamp_seconds",
            "When the last reconcile pass ended (unix time).",
            registry=r,
        )
        self.actions = Counter(
            "slurm_burst_reconcile_actions_total",
            "Repairs made by the reconcile loop, by action and code.",
            ["action", "code"],
            registry=r,
        )
        self.phase_errors = Counter(
            "slurm_burst_reconcile_phase_errors_total",
            "Reconcile phases (observe sources, actions) that failed.",
            ["phase"],
            registry=r,
        )
        self.contained_errors = Counter(
            "slurm_burst_contained_errors_total",
            "Errors no port declares, stopped at a thread or loop boundary (a defect to "
            "report): by boundary and code.",
            ["where", "code"],
            registry=r,
        )
        self.api_latency = Histogram(
            "slurm_burst_cloud_api_duration_seconds",
            "Cloud API call latency, by provider and call.",
            ["provider", "call"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.api_errors = Counter(
            "slurm_burst_cloud_api_errors_total",
            "Cloud API calls that failed, by provider, call and error code.",
            ["provider", "call", "code"],
            registry=r,
        )
        self.api_budget = Gauge(
            "slurm_burst_cloud_api_tokens",
            "Request tokens the daemon's budget has left per provider account (named after "
            "its first profile) and API, or calls left in a quota group's current minute "
            "(GCE); negative: promised to calls waiting their turn.",
            ["account", "api"],
            registry=r,
        )
        self.api_throttles = Counter(
            "slurm_burst_cloud_api_throttled_total",
            "Throttled answers (RequestLimitExceeded, rateLimitExceeded, HTTP 429/503) by "
            "provider and API (GCE: its quota group): the account's budget is spent by "
            "someone else too, or ours is set too high.",
            ["provider", "api"],
            registry=r,
        )
        self.spend_rate = Gauge(
            "slurm_burst_spend_rate_dollars_per_hour",
            "What the live cloud instances cost per hour, by node group.",
            ["group"],
            registry=r,
        )
        self.protected = Gauge(
            "slurm_burst_group_protected",
            "1 when the node group is in protected mode.",
            ["group"],
            registry=r,
        )
        self.cap_room = Gauge(
            "slurm_burst_group_cap_room",
            "More instances a capped node group's max_nodes allows now (0: at its cap).",
            ["group"],
            registry=r,
        )
        self.over_cap = Counter(
            "slurm_burst_resumes_over_cap_total",
            "Resumes the daemon refused because the node group was at its max_nodes.",
            ["group"],
            registry=r,
        )
        self.leader = Gauge(
            "slurm_burst_leader", "1 when this daemon is the active (leader) daemon.", registry=r
        )
        self.heartbeat_at = Gauge(
            "slurm_burst_heartbeat_timestamp_seconds", "The daemon's last heartbeat.", registry=r
        )

        self.join_duration = Histogram(
            "slurm_burst_node_join_duration_seconds",
            "From Slurm's resume request to the node's slurmd started, by node group.",
            ["group"],
            buckets=JOIN_BUCKETS,
            registry=r,
        )
        self.step_duration = Histogram(
            "slurm_burst_node_step_duration_seconds",
            "How long each step of a launch and bootstrap took when it succeeded.",
            ["step"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.orphans = Gauge(
            "slurm_burst_orphan_instances",
            "Instances tagged with this cluster that no live node owns, at the last pass.",
            ["provider"],
            registry=r,
        )
        self.stale_peers = Gauge(
            "slurm_burst_stale_peers",
            "Hub WireGuard peers whose key no live node holds, at the last pass.",
            registry=r,
        )
        self.leaked_addresses = Gauge(
            "slurm_burst_leaked_addresses",
            "Mesh addresses held by nodes that are not live, at the last pass.",
            registry=r,
        )
        self.oldest_resume = Gauge(
            "slurm_burst_oldest_resume_age_seconds",
            "Age of the oldest node of the group asked for and not yet joined (0: none).",
            ["group"],
            registry=r,
        )
        self.slurm_nodes = Gauge(
            "slurm_burst_slurm_nodes",
            "Slurm's nodes by side (onprem, cloud: a burst group's) and activity.",
            ["side", "activity"],
            registry=r,
        )
        self.last_ingest = Gauge(
            "slurm_burst_ledger_last_ingest_timestamp_seconds",
            "When the ledger last read finished jobs from sacct (unix time).",
            registry=r,
        )
        self.spend = SpendCollector()
        r.register(self.spend)
        a = ["account"]
        self.budget = Gauge(
            "slurm_burst_budget_dollars", "The account's budget this period.", a, registry=r
        )
        self.budget_spent = Gauge(
            "slurm_burst_budget_spent_dollars",
            "Booked this period, overhead included.",
            a,
            registry=r,
        )
        self.budget_remaining = Gauge(
            "slurm_burst_budget_remaining_dollars",
            "Budget less the booked spend and what running burst jobs have committed.",
            a,
            registry=r,
        )
        self.budget_period_end = Gauge(
            "slurm_burst_budget_period_end_timestamp_seconds",
            "When the budget period ends (unix time; budgets are monthly).",
            registry=r,
        )
        self.info = Gauge(
            "slurm_burst_info", "The daemon's version (value 1).", ["version"], registry=r
        )
        self.info.labels(__version__).set(1)
        self.partition_info = Gauge(
            "slurm_burst_partition_info",
            "Each burst partition and a node group in it (value 1): joined on partition, it "
            "keeps the burst partitions of slurmctld's own slurm_partition_* series.",
            ["partition", "group"],
            registry=r,
        )

        g = ["group"]
        self.gpu_count = Gauge(
            "slurm_burst_gpus_sampled", "GPUs of joined nodes at the last sample.", g, registry=r
        )
        self.gpu_util = Gauge(
            "slurm_burst_gpu_utilization_ratio",
            "Mean GPU utilization (0-1) over the group's sampled GPUs.",
            g,
            registry=r,
        )
        self.gpu_memory = Gauge(
            "slurm_burst_gpu_memory_used_bytes", "GPU memory in use, summed.", g, registry=r
        )
        self.gpu_power = Gauge(
            "slurm_burst_gpu_power_watts", "GPU power draw, summed.", g, registry=r
        )
        d = ["direction", "store"]
        self.stage_transfers = Counter(
            "slurm_burst_stage_transfers_total",
            "Dataset transfers (in: site to store, pull: store to node, out: to the site), "
            "by direction, store and result (ok, failed).",
            [*d, "result"],
            registry=r,
        )
        self.stage_bytes = Counter(
            "slurm_burst_stage_bytes_total",
            "Bytes sent by dataset transfers that completed (on the wire), by direction and store.",
            d,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "slurm_burst_stage_transfer_duration_seconds",
            "Wall time of dataset transfers that completed, by direction.",
            ["direction"],
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200),
            registry=r,
        )
        self.held_nodes = Gauge(
            "slurm_burst_outputs_held_nodes",
            "Suspended cloud nodes kept until their jobs' outputs (stage_out) are home.",
            registry=r,
        )
        self.held_seconds_left = Gauge(
            "slurm_burst_outputs_release_seconds_left",
            "Seconds until the first held node's staging.release_deadline (+Inf: none held).",
            registry=r,
        )
        self.held_seconds_left.set(math.inf)
        self.outputs_lost = Counter(
            "slurm_burst_outputs_lost_total",
            "Stage-outs that did not all come home (the output's record says what is where).",
            registry=r,
        )
        n = ["node", "gpu"]  # only with gpu.per_gpu_metrics: grows with the fleet
        self.node_gpu_util = Gauge(
            "slurm_burst_node_gpu_utilization_ratio", "Utilization (0-1) of one GPU.", n, registry=r
        )
        self.node_gpu_memory = Gauge(
            "slurm_burst_node_gpu_memory_used_bytes", "Memory in use on one GPU.", n, registry=r
        )
        self.node_gpu_power = Gauge(
            "slurm_burst_node_gpu_power_watts", "Power draw of one GPU.", n, registry=r
        )

    def serve(self, listen: str) -> None:
        """Serve ``/metrics`` on ``HOST:PORT`` from a daemon thread."""
        host, _, port = listen.rpartition(":")
        start_http_server(int(port), addr=host or "0.0.0.0", registry=self.registry)  # noqa: S104 - the admin's choice

    # -- the port ------------------------------------------------------------------
    def launched(self, group: str, provider: str, size: str) -> None:
        self.launches.labels(group, provider, size).inc()

    def failed(self, group: str, code: str) -> None:
        self.failures.labels(group, code).inc()

    def cloud_call(self, provider: str, call: str, seconds: float, error: str | None) -> None:
        self.api_latency.labels(provider, call).observe(seconds)
        if error is not None:
            self.api_errors.labels(provider, call, error).inc()

    def api_tokens(self, account: str, api: str, tokens: float) -> None:
        self.api_budget.labels(account, api).set(tokens)

    def api_throttled(self, provider: str, api: str) -> None:
        self.api_throttles.labels(provider, api).inc()

    def leading(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def heartbeat(self, at: float) -> None:
        self.heartbeat_at.set(at)

    def reconcile_pass(self, seconds: float, ended: float) -> None:
        self.passes.inc()
        self.pass_duration.observe(seconds)
        self.last_pass.set(ended)

    def reconcile_action(self, kind: str, code: str) -> None:
        self.actions.labels(kind, code).inc()

    def phase_error(self, phase: str) -> None:
        self.phase_errors.labels(phase).inc()

    def contained(self, where: str, code: str) -> None:
        self.contained_errors.labels(where, code).inc()

    def fleet(self, view: FleetStatus) -> None:
        for g in view.groups.values():
            for state in NODE_STATES:
                self.nodes.labels(g.name, state).set(g.nodes.get(state, 0))
            self.spend_rate.labels(g.name).set(g.spend_per_hour)
            self.protected.labels(g.name).set(1 if g.protected(view.at) else 0)

    def cap(self, group: str, room: int) -> None:
        self.cap_room.labels(group).set(room)

    def burst_partitions(self, pairs: Iterable[tuple[str, str]]) -> None:
        """The config's (partition, group) pairs, once at the start (they change with it)."""
        for partition, group in pairs:
            self.partition_info.labels(partition, group).set(1)

    def resume_over_cap(self, group: str) -> None:
        self.over_cap.labels(group).inc()

    def step(self, step: str, seconds: float) -> None:
        self.step_duration.labels(step).observe(seconds)

    def joined(self, group: str, seconds: float) -> None:
        self.join_duration.labels(group).observe(seconds)

    def findings(
        self,
        orphans: Mapping[str, int],
        stale_peers: int,
        leaked_addresses: int,
        oldest_resume: Mapping[str, float],
    ) -> None:
        """What the reconcile pass found wrong, before the grace periods act on it; a
        provider or group with nothing to say is set to 0, so the series stay."""
        for provider, n in orphans.items():
            self.orphans.labels(provider).set(n)
        self.stale_peers.set(stale_peers)
        self.leaked_addresses.set(leaked_addresses)
        for group, age in oldest_resume.items():
            self.oldest_resume.labels(group).set(age)

    def slurm_node_activity(self, counts: Mapping[tuple[str, str], int]) -> None:
        for side in SIDES:
            for activity in NODE_ACTIVITY:
                self.slurm_nodes.labels(side, activity).set(counts.get((side, activity), 0))

    def ledger_ingested(self, at: float) -> None:
        self.last_ingest.set(at)

    def spent(self, totals: Mapping[tuple[str, str], float]) -> None:
        """All-time booked spend by (account, group): the ``max_accounts`` biggest
        spenders each have series; the rest are summed under ``_other``."""
        by_account: dict[str, float] = {}
        for (account, _group), dollars in totals.items():
            by_account[account] = by_account.get(account, 0.0) + dollars
        ranked = sorted(by_account, key=lambda a: (-by_account[a], a))
        kept = set(ranked[: self.max_accounts])
        out: dict[tuple[str, str], float] = {}
        for (account, group), dollars in totals.items():
            key = (account if account in kept else OTHER_ACCOUNTS, group)
            out[key] = out.get(key, 0.0) + dollars
        self.spend.totals = out

    def budgets(self, budgets: Mapping[str, tuple[float, float, float]], period_end: float) -> None:
        """Each budgeted account's (budget, spent, remaining) dollars this period."""
        for gauge in (self.budget, self.budget_spent, self.budget_remaining):
            gauge.clear()
        for account, (budget, spent, remaining) in budgets.items():
            self.budget.labels(account).set(budget)
            self.budget_spent.labels(account).set(spent)
            self.budget_remaining.labels(account).set(remaining)
        self.budget_period_end.set(period_end)

    def gpus(
        self,
        by_group: Mapping[str, GroupGpus],
        per_gpu: Mapping[str, Sequence[GpuSample]] | None,
    ) -> None:
        """The latest GPU samples: per group always; per node and GPU when asked (a
        node gone since is dropped, so the series do not outlive it)."""
        for gauge in (self.gpu_count, self.gpu_util, self.gpu_memory, self.gpu_power):
            gauge.clear()
        for group, agg in by_group.items():
            self.gpu_count.labels(group).set(agg.gpus)
            self.gpu_memory.labels(group).set(agg.memory_used_bytes)
            self.gpu_power.labels(group).set(agg.power_watts)
            if agg.utilization is not None:
                self.gpu_util.labels(group).set(agg.utilization)
        for gauge in (self.node_gpu_util, self.node_gpu_memory, self.node_gpu_power):
            gauge.clear()
        for node, samples in (per_gpu or {}).items():
            for s in samples:
                i = str(s.index)
                if s.utilization is not None:
                    self.node_gpu_util.labels(node, i).set(s.utilization / 100)
                if s.memory_used_bytes is not None:
                    self.node_gpu_memory.labels(node, i).set(s.memory_used_bytes)
                if s.power_watts is not None:
                    self.node_gpu_power.labels(node, i).set(s.power_watts)

    def transfer(
        self, direction: str, store: str, ok: bool, bytes_sent: int, seconds: float
    ) -> None:
        self.stage_transfers.labels(direction, store, "ok" if ok else "failed").inc()
        if ok:
            self.stage_bytes.labels(direction, store).inc(max(0, bytes_sent))
            self.stage_seconds.labels(direction).observe(max(0.0, seconds))

    def outputs_held(self, nodes: int, seconds_left: float) -> None:
        self.held_nodes.set(nodes)
        self.held_seconds_left.set(seconds_left)

    def output_lost(self) -> None:
        self.outputs_lost.inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
