"""Resume of 1,000 nodes of one node group against the EC2 emulator: batched launch
(one RunInstances per group and size, MinCount = MaxCount) against one create_node per
node, in the same run; then the batched mode five more times with two CPU burners
running beside the daemon (a loaded controller).

For each run: the resume hook program (a new process, as Slurm runs it) records the
request; the daemon (in this process, its real request and launch path) launches;
the clock stops when every node has its instance recorded. Printed: launch API calls
(RunInstances), all API calls, the time from the daemon waking up with the request to
its first launch call, and the wall time from the hook to all instances requested
(goals: <= 10 launch calls in every run, first launch <= 0.2 s, <= 10 s unloaded). The
daemon's later steps (boot, SSH) are not run: nothing boots in an emulator, and they
are not what is measured.

    python benchmarks/launch.py [--nodes 1000] [--loaded-runs 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_burst_lab.ec2emu import RemoteEmulator, Scale  # noqa: E402

from slurm_burst.adapters.cloud.compute import LibcloudCloud  # noqa: E402
from slurm_burst.adapters.ha import SoleLeader  # noqa: E402
from slurm_burst.adapters.ssh.session import SshConnector, generate_key  # noqa: E402
from slurm_burst.adapters.state.store import Store  # noqa: E402
from slurm_burst.config import Config, load_config  # noqa: E402
from slurm_burst.core.cloud import LaunchSpec  # noqa: E402
from slurm_burst.core.nodestate import NodeState  # noqa: E402
from slurm_burst.core.records import NodeRecord, Request  # noqa: E402
from slurm_burst.services.provisioner import Provisioner, Secrets  # noqa: E402
from slurm_burst.wiring.clouds import managed_clouds  # noqa: E402
from slurm_burst.wiring.daemon import DaemonParts, assemble  # noqa: E402
from slurm_burst.wiring.ledger import daemon_ledger  # noqa: E402
from slurm_burst.wiring.ledger import ledger as sql_ledger  # noqa: E402
from slurm_burst.wiring.light import clock as system_clock  # noqa: E402
from slurm_burst.wiring.light import state_db_path  # noqa: E402
from tests.fakes.mesh import FakeMesh  # noqa: E402
from tests.fakes.slurm import FakeScheduler  # noqa: E402
from tests.integration.ec2config import CONFIG  # noqa: E402

T = TypeVar("T")
# the emulator's scale mode without throttling: EC2's answer times for RunInstances
SCALE = Scale(throttle=0.0)
GONE = (NodeState.FAILED, NodeState.TERMINATING, NodeState.TERMINATED)


def launch_only(prov: Provisioner) -> Callable[[str], NodeRecord | None]:
    """The provisioner's drive, stopped after the launch step (what is measured)."""

    def drive(name: str, **_: bool) -> NodeRecord | None:
        rec = prov.store.node(name)
        group = prov.fleet.group_of(name)
        if rec is not None and group and rec.state in (NodeState.REQUESTED, NodeState.LAUNCHING):
            prov.launcher.launch_one(rec, group)
        return prov.store.node(name)

    return drive


def config(tmp: Path, emu: RemoteEmulator, nodes: int, batch: int) -> Config:
    cluster = f"bench{batch}-{time.time_ns() % 10**9}"  # each run its own tokens and instances
    text = CONFIG.format(cluster=cluster, tmp=tmp, port=emu.port, spot="false")
    text = text.replace("count = 64", f"count = {nodes}")
    text = text.replace(
        'signature_version = "4" }', f'signature_version = "4" }}\nlaunch_batch = {batch}'
    )
    path = tmp / "slurm-burst.toml"
    path.write_text(text)
    path.chmod(0o640)
    return load_config(path)


class Run(NamedTuple):
    launches: int  # RunInstances calls
    calls: int  # all EC2 API calls
    first_launch: float  # s from the daemon finding the request to its first launch call
    wall: float  # s from the hook starting to every node having its instance


def run(emu: RemoteEmulator, nodes: int, batch: int) -> Run:
    with (
        tempfile.TemporaryDirectory() as d,
        launching(emu, Path(d), nodes, batch) as (
            cfg,
            store,
            aws,
        ),
    ):
        marks = watch(store, aws)
        started = time.perf_counter()
        resume(cfg, nodes)
        while True:  # every node has its instance, or has failed (then say so)
            recs = store.nodes()
            lost = sum(1 for r in recs if not r.instance_id and r.state in GONE)
            if sum(1 for r in recs if r.instance_id) + lost >= nodes:
                break
            time.sleep(0.02)
        if lost:
            print(f"  ({lost} nodes failed: see the log above)")
        wall = time.perf_counter() - started
    calls = emu.calls()
    return Run(
        calls.get("RunInstances", 0),
        sum(calls.values()),
        marks["launch"] - marks["woke"],
        wall,
    )


@contextmanager
def launching(
    emu: RemoteEmulator, tmp: Path, nodes: int, batch: int
) -> Iterator[tuple[Config, Store, LibcloudCloud]]:
    """The daemon (its real parts, each node's drive stopped after the launch step)
    running against ``emu`` with its state in ``tmp`` until the block ends; the
    emulator's counts cleared once it is up."""
    (tmp / "slurm").mkdir()
    cfg = config(tmp, emu, nodes, batch)
    parts, aws = daemon_parts(
        cfg, tmp, FakeScheduler.cloud_nodes(cfg.node_groups["cpu"].node_names())
    )
    store = parts.store
    assert isinstance(store, Store)
    daemon = assemble(cfg, parts)
    daemon.prov.drive = launch_only(daemon.prov)  # type: ignore[method-assign,assignment]
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    try:
        while store.heartbeat() is None:
            time.sleep(0.05)
        emu.clear()
        yield cfg, store, aws
    finally:
        daemon.stop.set()
        runner.join(timeout=60)


def resume(cfg: Config, nodes: int) -> None:
    """Slurm's ResumeProgram for the cpu group's nodes 1 to ``nodes`` (aws-[1-nodes]):
    the hook, a process of its own."""
    hosts = cfg.node_groups["cpu"].pattern.replace("{n}", f"[1-{nodes}]")
    hook = [sys.executable, "-m", "slurm_burst", "--config", cfg.source, "resume", hosts]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(hook, check=True, env=env, capture_output=True)


def daemon_parts(
    cfg: Config, tmp: Path, scheduler: FakeScheduler, provider: str = "aws",
    size: str = "c5.large",
) -> tuple[DaemonParts, LibcloudCloud]:  # fmt: skip
    """The daemon's real parts for a run against an emulator (the ledger and state
    database in ``tmp``), with a fake mesh and Slurm; and the ``provider`` profile inside."""
    key = str(tmp / "ssh" / "id_ed25519")
    sql = sql_ledger(cfg, check_schema=False)
    sql.upgrade()
    clouds = managed_clouds(cfg)
    cloud = clouds[provider].inner
    assert isinstance(cloud, LibcloudCloud)
    if size:  # the size table, read once at start (as a first launch does; Azure: none)
        cloud._size(size)
    clock = system_clock()
    parts = DaemonParts(
        store=Store(state_db_path(cfg)),
        clouds=clouds,
        mesh=FakeMesh(clock),  # nothing joins the mesh here
        connector=SshConnector(cfg.daemon.ssh_user, key),
        scheduler=scheduler,
        ledger=daemon_ledger(cfg, sql),
        secrets=Secrets(generate_key(key), b""),
        leader=SoleLeader("bench"),
        clock=clock,
    )
    return parts, cloud


def watch(store: Store, aws: LibcloudCloud) -> dict[str, float]:
    """Note when the daemon first finds a pending request and when it first calls the
    provider to launch (either way)."""
    marks: dict[str, float] = {}
    pending, launch, launch_many = store.pending_requests, aws.launch, aws.launch_many

    def pending_requests() -> list[Request]:
        found = pending()
        if found:
            marks.setdefault("woke", time.perf_counter())
        return found

    def mark_launch(fn: Callable[[LaunchSpec], T]) -> Callable[[LaunchSpec], T]:
        def call(spec: LaunchSpec) -> T:
            marks.setdefault("launch", time.perf_counter())
            return fn(spec)

        return call

    store.pending_requests = pending_requests  # type: ignore[method-assign]
    aws.launch = mark_launch(launch)  # type: ignore[method-assign,assignment]
    aws.launch_many = mark_launch(launch_many)  # type: ignore[method-assign,assignment]
    return marks


@contextmanager
def burners(n: int) -> Iterator[None]:
    """``n`` CPU-bound processes for the duration (a loaded controller)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def show(label: str, r: Run) -> None:
    print(
        f"  {label:<30} launch calls {r.launches:5d}  all calls {r.calls:5d}  "
        f"first launch {r.first_launch * 1000:6.0f} ms  hook -> all requested {r.wall:6.2f} s"
    )


def fresh(nodes: int, batch: int) -> Run:
    """One run against an emulator of its own: moto slows down with every instance it
    holds, and EC2 does not."""
    emu = RemoteEmulator(SCALE)  # EC2 is another service: the emulator runs in its own process
    try:
        return run(emu, nodes, batch)
    finally:
        emu.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--loaded-runs", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("SB_TEST_AWS_KEY", "AKIDEMULATOR000000000")
    os.environ.setdefault("SB_TEST_AWS_SECRET", "emulator-secret")
    print(
        f"resume of {args.nodes} nodes of one group, EC2 emulator (moto, own process, "
        "a fresh one each run) on loopback"
    )
    show("batched", fresh(args.nodes, 0))
    # one RunInstances a node is paced by its budget (75 % of EC2's 2 a second): a few
    # dozen show the difference without taking ten minutes
    few = min(args.nodes, 60)
    show(f"one create_node per node ({few})", fresh(few, 1))
    loaded = []
    with burners(2):
        for i in range(args.loaded_runs):
            loaded.append(fresh(args.nodes, 0))
            show(f"batched, 2 CPU burners, run {i + 1}", loaded[-1])
    if loaded:
        batched = sum(1 for r in loaded if r.launches <= 10)
        worst = max(r.first_launch for r in loaded)
        print(
            f"  loaded: {batched}/{len(loaded)} runs batched (<= 10 launch calls); "
            f"first launch at worst {worst * 1000:.0f} ms"
        )
    print("  goals: <= 10 launch calls in every batched run; first launch <= 200 ms; "
          "<= 10 s unloaded")  # fmt: skip


if __name__ == "__main__":
    main()
