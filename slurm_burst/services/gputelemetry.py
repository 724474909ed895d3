"""GPU telemetry: sample the joined GPU nodes through NVML, export metrics, roll up
per-job GPU use into the ledger.

Every ``gpu.telemetry_interval`` seconds the leader's telemetry thread

1. runs ``gpucheck.py sample`` over SSH on each joined node of a GPU group (the same
   host keys and key as the bootstrap; a few nodes at once, each bounded in time);
2. exports per-group aggregates (and per-GPU series when ``gpu.per_gpu_metrics``);
3. asks Slurm which running jobs hold which GPU indices on those nodes (one squeue;
   ``scontrol -d show job`` once per job, when it is first seen: an allocation does
   not change while the job runs) and books each job's held GPUs' utilization
   (``core.gpu.UsageBook``), recording a period when the job leaves the node and
   every ten minutes while it runs.

A node that does not answer is left out of that sample (its jobs' time is not
counted, rather than counted idle). Nothing here can stop provisioning: every
failure is logged and the next pass tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from slurm_burst.config import Fleet, GpuConfig
from slurm_burst.core.errors import BurstError
from slurm_burst.core.gpu import (
    GpuSample,
    GpuUsage,
    GroupGpus,
    UsageBook,
    by_group,
    job_key,
    parse_sample,
)
from slurm_burst.core.jsonread import read_json
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.records import NodeRecord
from slurm_burst.ports import Clock, Connector, Metrics, NodeBook, Scheduler
from slurm_burst.services.periodic import every
from slurm_burst.services.provisioner import GPU_CHECK

log = logging.getLogger(__name__)

SAMPLE_TIMEOUT = 10.0  # seconds one node's sample may take, SSH included
PARALLEL = 8  # nodes sampled at once
FLUSH_AFTER = 600.0  # seconds between ledger rows of a job that keeps running


@dataclass(frozen=True, kw_only=True)
class TelemetrySettings:
    """What the GPU sampler needs of the config (wiring.daemon.telemetry_settings)."""

    fleet: Fleet
    gpu: GpuConfig  # node_python, telemetry_interval, per_gpu_metrics


class GpuTelemetry:
    def __init__(
        self,
        settings: TelemetrySettings,
        store: NodeBook,
        connector: Connector,
        scheduler: Scheduler,
        clock: Clock,
        stop: threading.Event,
        record: Callable[[Sequence[GpuUsage]], object] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.fleet = settings.fleet
        self.gpu = settings.gpu
        self.store = store
        self.connector = connector
        self.scheduler = scheduler
        self.clock = clock
        self.stop = stop
        self.record = record  # the ledger's gpu_usage; None: no ledger
        self.metrics = metrics
        self.book = UsageBook(flush_after=FLUSH_AFTER)
        self.allocations: dict[tuple[int, str], dict[str, tuple[int, ...]]] = {}
        self._last: float | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.gpu.telemetry_interval <= 0 or not self._groups():
            return
        self._thread = threading.Thread(target=self._loop, name="gpu-telemetry", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end (``stop`` is set): it records the open periods."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        every(self.gpu.telemetry_interval, self.stop, self.clock, self.pass_once,
              "gpu.telemetry", self.metrics)  # fmt: skip
        self._write(self.book.close_all())

    def _groups(self) -> dict[str, str]:
        """GPU group name -> its partition (groups whose nodes run the GPU check)."""
        return {
            g.name: g.partition for g in self.fleet.node_groups.values() if g.gpus and g.gpu_check
        }

    # -- one pass -------------------------------------------------------------------
    def pass_once(self) -> None:
        groups = self._groups()
        nodes = [r for r in self.store.nodes() if r.state == NodeState.JOINED and r.group in groups]
        samples = self._sample(nodes)
        now = self.clock.now()
        seconds = self.gpu.telemetry_interval
        if self._last is not None:  # the time since the last samples, at most two intervals
            seconds = min(max(now - self._last, 0.0), 2 * seconds)
        self._last = now
        if self.metrics is not None:
            agg = by_group(samples, lambda n: g.name if (g := self.fleet.group_of(n)) else None)
            for name in groups:  # a group with no node joined reads 0 GPUs, not stale ones
                agg.setdefault(name, GroupGpus(0, None, 0, 0.0))
            self.metrics.gpus(agg, samples if self.gpu.per_gpu_metrics else None)
        jobs = self._jobs(sorted(set(groups.values())), set(samples)) if samples else {}
        self._write(self.book.observe(now, seconds, jobs, samples))

    def _sample(self, nodes: list[NodeRecord]) -> dict[str, list[GpuSample]]:
        out: dict[str, list[GpuSample]] = {}
        if not nodes:
            return out
        with ThreadPoolExecutor(max_workers=min(PARALLEL, len(nodes))) as pool:
            for rec, result in zip(nodes, pool.map(self._sample_one, nodes), strict=True):
                if result is not None:
                    out[rec.name] = result
        return out

    def _sample_one(self, rec: NodeRecord) -> list[GpuSample] | None:
        argv = [self.gpu.node_python, GPU_CHECK, "sample"]
        try:
            sh = self.connector.connect(
                rec.ip, rec.host_key_list(), self.clock.monotonic() + SAMPLE_TIMEOUT
            )
            try:
                said = sh.run(argv, timeout=SAMPLE_TIMEOUT)
            finally:
                sh.close()
            return parse_sample(read_json(said, "a GPU sample"))
        except (BurstError, ValueError) as exc:  # one node's trouble (unreachable, a
            # sample that is not JSON or not a sample) is logged; the others are sampled
            log.warning("gpu.sample_failed node=%s error=%s", rec.name, str(exc)[:300])
            return None

    def _jobs(
        self, partitions: list[str], sampled: set[str]
    ) -> dict[tuple[str, int], dict[str, tuple[int, ...]]]:
        """Running jobs on sampled nodes: (job key, job id) -> node -> GPU indices."""
        running = {}
        for j in self.scheduler.jobs(partitions):
            if j.state == "RUNNING" and j.start_time is not None:
                running[
                    (j.job_id, job_key(self.fleet.cluster, j.job_id, j.start_time.timestamp()))
                ] = j
        self.allocations = {k: v for k, v in self.allocations.items() if k in running}
        new = [job_id for job_id, key in running if (job_id, key) not in self.allocations]
        if new:
            found = self.scheduler.job_gpus(new)
            for job_id, key in running:
                if job_id in found:
                    self.allocations[(job_id, key)] = found[job_id]
        return {
            (key, job_id): {n: idx for n, idx in nodes.items() if n in sampled}
            for (job_id, key), nodes in self.allocations.items()
        }

    def _write(self, rows: list[GpuUsage]) -> None:
        if not rows or self.record is None:
            return
        try:
            self.record(rows)
        except BurstError as exc:  # the ledger is away: these periods are lost, said loudly
            log.error("gpu.usage_not_recorded rows=%d error=%s", len(rows), exc)
