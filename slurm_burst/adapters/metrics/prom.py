"""The daemon's Prometheus metrics (prometheus-client), on a registry of its own.

Names follow Prometheus conventions: ``slurm_burst_`` prefix, counters end in
``_total``, durations are seconds. Labels are bounded sets (groups, states,
providers, error codes), never node names or job ids; the one exception, per-GPU
series labelled by node, exists only when ``gpu.per_gpu_metrics`` asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.exposition import generate_latest

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


class Metrics:
    """The Metrics port as Prometheus series."""

    def __init__(self) -> None:
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
        self.leader = Gauge(
            "slurm_burst_leader", "1 when this daemon is the active (leader) daemon.", registry=r
        )
        self.heartbeat_at = Gauge(
            "slurm_burst_heartbeat_timestamp_seconds", "The daemon's last heartbeat.", registry=r
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

    def node_counts(self, by_group: Mapping[str, Mapping[str, int]], groups: Sequence[str]) -> None:
        for g in groups:
            counts = by_group.get(g, {})
            for state in NODE_STATES:
                self.nodes.labels(g, state).set(counts.get(state, 0))

    def group_status(self, group: str, spend_per_hour: float, protected: bool) -> None:
        self.spend_rate.labels(group).set(spend_per_hour)
        self.protected.labels(group).set(1 if protected else 0)

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

    def text(self) -> bytes:
        return generate_latest(self.registry)
