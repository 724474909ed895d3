"""A whole fake world for the services: the lab's config, and every port faked and
wired together as ``wiring.daemon.assemble`` wires the real ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_burst.adapters.ha import SoleLeader
from slurm_burst.config import Config
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.records import NodeRecord
from slurm_burst.ports import ServedStore
from slurm_burst.services.cloudcalls import ManagedCloud
from slurm_burst.services.daemon import Daemon
from slurm_burst.services.provisioner import Provisioner, Secrets
from slurm_burst.wiring.daemon import DaemonParts, assemble
from tests.conftest import lab_config_in, wait
from tests.fakes.clock import FakeClock
from tests.fakes.cloud import FakeCloud, address, host_key
from tests.fakes.host import FakeHost
from tests.fakes.ledger import FakeLedger
from tests.fakes.mesh import FakeMesh
from tests.fakes.slurm import FakeScheduler
from tests.fakes.ssh import FakeConnector
from tests.fakes.store import MemoryStore

MUNGE_KEY = b"munge-key-material-never-logged"
SSH_PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDaemonKeyForTheFakeWorld000000000000 daemon"


@dataclass
class World:
    cfg: Config
    clock: FakeClock
    store: MemoryStore
    cloud: FakeCloud
    mesh: FakeMesh
    connector: FakeConnector
    slurm: FakeScheduler
    ledger: FakeLedger
    daemon: Daemon

    @property
    def prov(self) -> Provisioner:
        return self.daemon.prov

    def request(self, *names: str, seq: int = 1) -> None:
        """Nodes asked up, as the daemon leaves a new resume request for the provisioner."""
        for n in names:
            group = self.cfg.group_of(n)
            assert group is not None, n
            self.store.transition(
                n,
                NodeState.REQUESTED,
                self.clock.now(),
                group=group.name,
                want=Want.UP,
                launch_seq=seq,
                requested_at=self.clock.now(),
            )

    def settle(self) -> None:
        """Handle the pending requests and wait until every worker is done."""
        self.daemon.handle_requests()
        wait(self.daemon.workers.idle, 10, "the workers to finish")

    def rec(self, name: str) -> NodeRecord:
        rec = self.store.node(name)
        assert rec is not None, f"no record of {name}"
        return rec


def make_world(
    tmp_path: Path,
    batch_max: int = 1,
    extra_config: str = "",
    edits: Sequence[tuple[str, str]] = (),
    served: Sequence[ServedStore] = (),
    lists_fleet: bool = False,
    slurm_release: str = "22.05",
) -> World:
    """``lists_fleet``: the cloud goes through ManagedCloud (budgets, retries) and booting
    nodes read a shared fleet listing, as EC2's do."""
    cfg = lab_config_in(tmp_path, extra_config, edits)
    for g in cfg.node_groups.values():  # the on-prem reference, as lab up captures it
        ref = Path(g.runtime_manifest)
        if g.runtime_manifest and not ref.exists() and ref.is_relative_to(tmp_path / "lab"):
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text('{"slurm_burst_runtime": 1, "os": "debian 12"}')
    clock = FakeClock()
    cloud = FakeCloud("lab", clock, batch_max=batch_max, boot_seconds=2.0, lists_fleet=lists_fleet)
    mesh = FakeMesh(clock)
    mesh.ensure_hub()

    def keys_of(host: str) -> list[tuple[str, str]] | None:
        for inst in cloud.live():
            if inst.state == "running" and address(inst.id) == host:
                return [("ssh-ed25519", host_key(inst.id))]
        return None

    connector = FakeConnector(clock, mesh, keys_of)
    connector.slurmd_version = f"{slurm_release}.8"
    slurm = FakeScheduler.cloud_nodes(cfg.node_groups["cpu"].node_names(), "burst-cpu")
    slurm.add_cloud_nodes(cfg.node_groups["gpu"].node_names(), "burst-gpu")
    store = MemoryStore()
    ledger = FakeLedger()
    parts = DaemonParts(
        store=store,
        clouds={"lab": ManagedCloud(cloud, sleep=clock.sleep) if lists_fleet else cloud},
        mesh=mesh,
        connector=connector,
        scheduler=slurm,
        ledger=ledger,
        secrets=Secrets(SSH_PUBLIC, MUNGE_KEY),
        leader=SoleLeader("test"),
        clock=clock,
        sql_ledger=None,
        slurm_release=slurm_release,  # the fake nodes' slurmd says 22.05.8 unless told
        host=FakeHost(),
        served=served,
    )
    return World(cfg, clock, store, cloud, mesh, connector, slurm, ledger, assemble(cfg, parts))
