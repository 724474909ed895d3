"""GPU telemetry, pure: what a node's sample says, per-group aggregates, per-job usage.

The daemon samples each joined GPU node (``gpucheck.py sample`` over SSH): per GPU,
utilization (percent), memory used and power. This module turns those samples into

- per node group aggregates (the default metrics: bounded by the number of groups);
- per job usage: for each (job, node), the GPU-seconds the job held and the part of
  them its GPUs were busy (utilization x time), over the GPU indices Slurm gave that
  job on that node. A :class:`UsageBook` accumulates between samples and hands out
  :class:`GpuUsage` rows to record (append-only) when a job leaves a node, and every
  ``flush_after`` seconds while it runs (a crash loses at most that much).

Times are unix seconds, passed in; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_burst.core.errors import BurstError


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization: float | None  # percent, 0..100; None: not supported or unreadable
    memory_used_bytes: int | None
    power_watts: float | None


@dataclass(frozen=True)
class GroupGpus:
    """One node group's GPUs at the last samples."""

    gpus: int  # GPUs sampled
    utilization: float | None  # mean ratio 0..1 over GPUs that report it
    memory_used_bytes: int
    power_watts: float


@dataclass(frozen=True)
class GpuUsage:
    """One (job, node) GPU usage period, as the ledger records it."""

    job_key: str  # cluster:jobid:start-epoch, as the jobs table
    job_id: int
    node: str
    start: float
    end: float
    gpus: int  # GPUs the job held on the node
    samples: int
    gpu_seconds: float  # gpus x time
    busy_gpu_seconds: float  # utilization x gpus x time, over the samples with a reading
    memory_used_max_bytes: int


class SampleError(BurstError, ValueError):
    """A node's sample is not what gpucheck.py prints."""

    code = "BadGpuSample"


def _number(value: Any, what: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SampleError(f"{what}: not a number ({value!r:.40})")
    if not low <= value <= high:
        raise SampleError(f"{what}: {value} is outside {low:g}..{high:g}")
    return float(value)


def parse_sample(data: Any) -> list[GpuSample]:
    """The GPUs of a node's ``sample`` output (parsed JSON); a GPU NVML lost reads as
    all None. Raises :class:`SampleError` on anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise SampleError("a sample is an object with a 'gpus' list")
    if len(data["gpus"]) > 64:
        raise SampleError(f"{len(data['gpus'])} GPUs in one node's sample")
    out = []
    for i, g in enumerate(data["gpus"]):
        if not isinstance(g, dict) or g.get("index") != i:
            raise SampleError(f"GPU {i}: not an object with index {i}")
        mem = _number(g.get("memory_used_bytes"), f"GPU {i} memory", 0, 2**50)
        out.append(
            GpuSample(
                index=i,
                utilization=_number(g.get("utilization"), f"GPU {i} utilization", 0, 100),
                memory_used_bytes=None if mem is None else int(mem),
                power_watts=_number(g.get("power_watts"), f"GPU {i} power", 0, 100_000),
            )
        )
    return out


def by_group(
    samples: Mapping[str, Sequence[GpuSample]], group_of: Callable[[str], str | None]
) -> dict[str, GroupGpus]:
    """Aggregate the nodes' samples per node group (nodes of no group are left out)."""
    acc: dict[str, list[GpuSample]] = {}
    for node, gpus in samples.items():
        group = group_of(node)
        if group is not None:
            acc.setdefault(group, []).extend(gpus)
    out = {}
    for group, gpus in acc.items():
        utils = [g.utilization for g in gpus if g.utilization is not None]
        out[group] = GroupGpus(
            gpus=len(gpus),
            utilization=sum(utils) / len(utils) / 100 if utils else None,
            memory_used_bytes=sum(g.memory_used_bytes or 0 for g in gpus),
            power_watts=sum(g.power_watts or 0.0 for g in gpus),
        )
    return out


@dataclass
class _Period:
    job_id: int
    start: float
    end: float
    gpus: int
    samples: int = 0
    gpu_seconds: float = 0.0
    busy_gpu_seconds: float = 0.0
    memory_max: int = 0


@dataclass
class UsageBook:
    """Per (job key, node) GPU usage between flushes."""

    flush_after: float = 600.0
    open: dict[tuple[str, str], _Period] = field(default_factory=dict)

    def observe(
        self,
        now: float,
        seconds: float,
        jobs: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
        samples: Mapping[str, Sequence[GpuSample]],
    ) -> list[GpuUsage]:
        """Count ``seconds`` (since the previous samples) for each running job's GPUs:
        ``jobs`` maps (job key, job id) to {node: GPU indices}. Returns the periods to
        record: those of jobs no longer running, and those older than ``flush_after``."""
        seen = set()
        for (key, job_id), nodes in jobs.items():
            for node, indices in nodes.items():
                gpus = samples.get(node)
                if gpus is None or not indices:
                    continue  # not sampled this time (unreachable): nothing to count
                seen.add((key, node))
                period = self.open.get((key, node))
                if period is None:
                    period = self.open[(key, node)] = _Period(job_id, now - seconds, now, 0)
                held = [gpus[i] for i in indices if 0 <= i < len(gpus)]
                utils = [g.utilization for g in held if g.utilization is not None]
                period.gpus = max(period.gpus, len(indices))
                period.end = now
                period.samples += 1
                period.gpu_seconds += len(indices) * seconds
                if utils:  # busy share of the GPUs that said, for all the GPUs held
                    period.busy_gpu_seconds += (
                        sum(utils) / 100 / len(utils) * len(indices) * seconds
                    )
                period.memory_max = max(
                    period.memory_max, sum(g.memory_used_bytes or 0 for g in held)
                )
        done = [
            k for k in self.open if k not in seen or now - self.open[k].start >= self.flush_after
        ]
        return [self._close(k) for k in done]

    def close_all(self) -> list[GpuUsage]:
        """Every open period (the daemon is stopping)."""
        return [self._close(k) for k in list(self.open)]

    def _close(self, key: tuple[str, str]) -> GpuUsage:
        p = self.open.pop(key)
        return GpuUsage(
            job_key=key[0],
            job_id=p.job_id,
            node=key[1],
            start=p.start,
            end=p.end,
            gpus=p.gpus,
            samples=p.samples,
            gpu_seconds=round(p.gpu_seconds, 3),
            busy_gpu_seconds=round(p.busy_gpu_seconds, 3),
            memory_used_max_bytes=p.memory_max,
        )


def job_key(cluster: str, job_id: int, start: float) -> str:
    """The ledger's key of a job run (as ``core.usage.JobUsage.key``)."""
    return f"{cluster}:{job_id}:{int(start)}"
