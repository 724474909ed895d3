"""The GPU telemetry service on the in-memory world: joined GPU nodes sampled over the
(fake) SSH connector, per-group metrics in the Prometheus adapter's text, Slurm asked
once per job for its GPU indices, usage periods handed to the ledger."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_burst.adapters.metrics.prom import Metrics
from slurm_burst.core.gpu import GpuUsage
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.slurm import SlurmJob
from slurm_burst.services.gputelemetry import GpuTelemetry
from slurm_burst.wiring.daemon import telemetry_settings
from tests.fakes.world import World, make_world

G1, G2 = "burst-gpu-1", "burst-gpu-2"


def _sample(*utils: int) -> dict[str, object]:
    return {
        "gpus": [
            {"index": i, "utilization": u, "memory_used_bytes": 2 << 30,
             "memory_total_bytes": 80 << 30, "power_watts": 100.0 + u}
            for i, u in enumerate(utils)
        ]
    }  # fmt: skip


@pytest.fixture
def w(tmp_path: Path) -> World:
    world = make_world(tmp_path)
    world.request(G1, G2)
    for name in (G1, G2):
        rec = world.prov.drive(name)
        assert rec is not None and rec.state == NodeState.JOINED
    return world


def _node(w: World, name: str):  # type: ignore[no-untyped-def]
    rec = w.store.node(name)
    assert rec is not None
    return w.connector.nodes[rec.ip]


def test_samples_become_metrics_and_job_usage(w: World) -> None:
    _node(w, G1).gpu_sample = _sample(80, 20)
    _node(w, G2).gpu_sample = _sample(0, 0)
    start = datetime.fromtimestamp(w.clock.now() - 60, UTC)
    w.slurm._jobs = [
        SlurmJob(41, "train", "RUNNING", "burst-gpu", G1, start_time=start),
        SlurmJob(42, "idle", "RUNNING", "burst-gpu", G2, start_time=start),
        SlurmJob(43, "cpu", "RUNNING", "burst-cpu", "burst-cpu-1", start_time=start),
    ]
    w.slurm.gpus = {41: {G1: (0,)}, 42: {G2: (0, 1)}}
    rows: list[GpuUsage] = []
    prom = Metrics()
    t = GpuTelemetry(telemetry_settings(w.cfg), w.store, w.connector, w.slurm, w.clock,
                     threading.Event(), rows.extend, prom)  # fmt: skip
    for _ in range(3):
        t.pass_once()
        w.clock.advance(w.cfg.gpu.telemetry_interval)
    assert w.slurm.job_gpus_calls == [[41, 42]]  # each job asked once (the CPU job never)
    text = prom.text().decode()
    assert 'slurm_burst_gpus_sampled{group="gpu"} 4.0' in text
    assert 'slurm_burst_gpu_utilization_ratio{group="gpu"} 0.25' in text
    assert 'slurm_burst_gpu_power_watts{group="gpu"} 500.0' in text
    assert "slurm_burst_node_gpu_utilization_ratio{" not in text  # per GPU: only on request
    w.slurm._jobs = w.slurm._jobs[1:]  # job 41 ended
    t.pass_once()
    assert [(r.job_id, r.node, r.gpus, r.samples) for r in rows] == [(41, G1, 1, 3)]
    (r41,) = rows
    interval = w.cfg.gpu.telemetry_interval
    assert r41.job_key == f"burstlab:41:{int(start.timestamp())}"
    assert r41.gpu_seconds == pytest.approx(3 * interval)
    assert r41.busy_gpu_seconds == pytest.approx(0.8 * 3 * interval)  # GPU 0 only: 80 %
    t.stop.set()
    t._write(t.book.close_all())
    assert [(r.job_id, r.gpus, r.busy_gpu_seconds) for r in rows[1:]] == [(42, 2, 0.0)]


def test_per_gpu_series_on_request_and_an_unreachable_node(w: World) -> None:
    cfg = replace(w.cfg, gpu=replace(w.cfg.gpu, per_gpu_metrics=True))
    _node(w, G1).gpu_sample = _sample(50, 50)
    _node(w, G2).gpu_sample = {"gpus": "garbage"}  # a node answering nonsense is left out
    prom = Metrics()
    t = GpuTelemetry(telemetry_settings(cfg), w.store, w.connector, w.slurm, w.clock,
                     threading.Event(), None, prom)  # fmt: skip
    t.pass_once()
    text = prom.text().decode()
    assert f'slurm_burst_node_gpu_utilization_ratio{{gpu="1",node="{G1}"}} 0.5' in text
    assert G2 not in text
    assert 'slurm_burst_gpus_sampled{group="gpu"} 2.0' in text
    w.store.transition(G1, NodeState.TERMINATING, w.clock.now())
    t.pass_once()  # the node left: its series go with it, the group reads 0
    text = prom.text().decode()
    assert G1 not in text and 'slurm_burst_gpus_sampled{group="gpu"} 0.0' in text
