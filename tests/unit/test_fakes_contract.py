"""The in-memory fakes pass the contracts their real adapters pass (tests/integration,
tests/lab): what the fast tests learn on them holds for the real thing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from slurm_burst.core.cloud import LaunchSpec
from tests.contracts.cloud import CloudContract
from tests.contracts.ledger import LedgerContract
from tests.contracts.mesh import MeshContract
from tests.contracts.slurm import SchedulerContract
from tests.contracts.ssh import ShellContract
from tests.contracts.store import (
    AddressPoolContract,
    GroupBookContract,
    LaunchBookContract,
    LeadershipContract,
    NodeBookContract,
    PassBookContract,
    RequestBookContract,
    StageBookContract,
    StoreContract,
)
from tests.fakes.clock import FakeClock
from tests.fakes.cloud import FakeCloud
from tests.fakes.ledger import FakeLedger
from tests.fakes.mesh import FakeMesh
from tests.fakes.slurm import FakeScheduler
from tests.fakes.ssh import FakeConnector
from tests.fakes.store import (
    MemoryAddresses,
    MemoryGroups,
    MemoryLaunches,
    MemoryLeadership,
    MemoryNodes,
    MemoryPasses,
    MemoryRequests,
    MemoryStages,
    MemoryStore,
)


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


class TestMemoryStore(StoreContract):
    @pytest.fixture()
    def store(self) -> MemoryStore:
        return MemoryStore()


# each part alone, as a service that needs only it would get it
class TestMemoryNodes(NodeBookContract):
    @pytest.fixture()
    def store(self) -> MemoryNodes:
        return MemoryNodes()


class TestMemoryRequests(RequestBookContract):
    @pytest.fixture()
    def store(self) -> MemoryRequests:
        return MemoryRequests()


class TestMemoryStages(StageBookContract):
    @pytest.fixture()
    def store(self) -> MemoryStages:
        return MemoryStages()


class TestMemoryAddresses(AddressPoolContract):
    @pytest.fixture()
    def store(self) -> MemoryAddresses:
        return MemoryAddresses()


class TestMemoryGroups(GroupBookContract):
    @pytest.fixture()
    def store(self) -> MemoryGroups:
        return MemoryGroups()


class TestMemoryLaunches(LaunchBookContract):
    @pytest.fixture()
    def store(self) -> MemoryLaunches:
        return MemoryLaunches()


class TestMemoryLeadership(LeadershipContract):
    @pytest.fixture()
    def store(self) -> MemoryLeadership:
        return MemoryLeadership()


class TestMemoryPasses(PassBookContract):
    @pytest.fixture()
    def store(self) -> MemoryPasses:
        return MemoryPasses()


class TestFakeCloud(CloudContract):
    @pytest.fixture(params=[1, 500], ids=["one-per-call", "batched"])
    def cloud(self, request: pytest.FixtureRequest, clock: FakeClock) -> FakeCloud:
        return FakeCloud("fake", clock, batch_max=request.param)

    @pytest.fixture()
    def cluster(self) -> str:
        return "contract"

    @pytest.fixture()
    def make_spec(self) -> Callable[..., LaunchSpec]:
        def make(node: str, token: str, count: int = 1) -> LaunchSpec:
            return LaunchSpec(node, "contract", "cpu", "s1", "img", token, "ssh-ed25519 AAAA",
                              "#!/bin/sh\n", count=count)  # fmt: skip

        return make

    @pytest.fixture()
    def settle(self, clock: FakeClock) -> Callable[[], None]:
        return lambda: clock.sleep(1.0)


class TestFakeMesh(MeshContract):
    @pytest.fixture()
    def mesh(self, clock: FakeClock) -> FakeMesh:
        return FakeMesh(clock)


class TestFakeShell(ShellContract):
    @pytest.fixture()
    def connector(self, clock: FakeClock) -> FakeConnector:
        return FakeConnector(clock)

    @pytest.fixture()
    def node(self, connector: FakeConnector) -> tuple[str, list[tuple[str, str]]]:
        keys = [("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIHnode0key0for0the0contract0test0000000")]
        connector.node_at("192.0.2.10", keys)
        return "192.0.2.10", keys

    @pytest.fixture()
    def nowhere(self) -> str:
        return "192.0.2.99"


class TestFakeScheduler(SchedulerContract):
    @pytest.fixture()
    def scheduler(self) -> FakeScheduler:
        return FakeScheduler.cloud_nodes(["burst-1", "burst-2"])

    @pytest.fixture()
    def names(self) -> list[str]:
        return ["burst-1", "burst-2"]


class TestFakeLedger(LedgerContract):
    @pytest.fixture()
    def ledger(self) -> FakeLedger:
        return FakeLedger()
