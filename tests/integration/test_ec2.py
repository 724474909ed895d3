"""EC2 for real, against an emulator: libcloud's own EC2 driver over HTTP (SigV4) to moto's
EC2 server on loopback (lab/slurm_burst_lab/ec2emu.py: moto behind a wrapper that answers like
EC2 where moto differs, and injects real EC2 error documents).

Covered: a 64-node resume through the daemon (hook -> state database -> daemon ->
one RunInstances -> instances tagged with their node names), a duplicate resume,
idempotency by ClientToken and by the token tag after a crash, spot, tag-filtered
listing, terminate, each EC2 error code as our typed error and node reason, and
capacity fallback to the next size.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.adapters.ha import SoleLeader
from slurm_burst.adapters.ssh.session import SshConnector, generate_key
from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config, load_config
from slurm_burst.core.cloud import (
    NODE_TAG,
    AuthError,
    CapacityError,
    CloudError,
    LaunchSpec,
    QuotaError,
    ThrottledError,
)
from slurm_burst.core.jobs import jobs_by_node
from slurm_burst.core.nodestate import NodeState, Want, reason
from slurm_burst.core.ratelimit import ApiBudgets
from slurm_burst.core.records import Batch
from slurm_burst.services.daemon import Daemon
from slurm_burst.services.launcher import Candidate
from slurm_burst.services.provisioner import Later, Provisioner, Secrets
from slurm_burst.wiring.clouds import cloud_driver, managed_clouds
from slurm_burst.wiring.daemon import DaemonParts, assemble
from slurm_burst.wiring.ledger import daemon_ledger
from slurm_burst.wiring.ledger import ledger as sql_ledger
from slurm_burst.wiring.light import clock as system_clock
from slurm_burst.wiring.light import state_db_path
from tests.conftest import invoke, wait
from tests.contracts.cloud import CloudContract
from tests.fakes.mesh import FakeMesh
from tests.fakes.slurm import FakeScheduler

moto = pytest.importorskip(
    "moto", reason="the EC2 emulator needs moto[server] (make test installs it)"
)

from slurm_burst_lab.ec2emu import Ec2Emulator  # noqa: E402 - after the importorskip

from tests.providers import FIXTURES, NOVA, Http  # noqa: E402


def daemon(cfg: Config, tmp: Path, slurm: FakeScheduler | None = None) -> Daemon:
    """The daemon as daemon.daemon builds it, on the EC2 emulator and the SQLite state and
    ledger; the hub and Slurm are fakes (no instance boots in an emulator, and no
    slurmctld knows these nodes: the lab's fault matrix checks real Slurm reasons)."""
    key = str(tmp / "ssh" / "id_ed25519")
    public = generate_key(key)
    sql = sql_ledger(cfg, check_schema=False)
    sql.upgrade()  # as the daemon does at start
    clock = system_clock()
    parts = DaemonParts(
        store=Store(state_db_path(cfg)),
        clouds=managed_clouds(cfg),
        mesh=FakeMesh(clock),
        connector=SshConnector(cfg.daemon.ssh_user, key),
        scheduler=slurm
        or FakeScheduler.cloud_nodes([n for g in cfg.node_groups.values() for n in g.node_names()]),
        ledger=daemon_ledger(cfg, sql),
        secrets=Secrets(public, b"unused"),
        leader=SoleLeader("test"),
        clock=clock,
        sql_ledger=sql,
    )
    return assemble(cfg, parts)


def provisioner(cfg: Config, tmp: Path, slurm: FakeScheduler | None = None) -> Provisioner:
    return daemon(cfg, tmp, slurm).prov


def requested(prov: Provisioner, *names: str, jobs: Sequence[dict[str, object]] = ()) -> None:
    """Nodes of the test group asked up, as a resume (of ``jobs``) leaves them for the
    provisioner."""
    by_node = jobs_by_node(jobs, names)
    for n in names:
        prov.store.transition(
            n, NodeState.REQUESTED, time.time(), group=getattr(prov.fleet.group_of(n), "name", ""),
            want=Want.UP, launch_seq=1,
            jobs=json.dumps(by_node.get(n, [])),
        )  # fmt: skip


def launch_batch(prov: Provisioner, names: list[str]) -> None:
    """What the daemon's batch worker does with newly requested nodes."""
    requested = [r for r in map(prov.store.node, names) if r is not None]
    for plan in prov.launcher.plan(requested):
        for name, exc in prov.launcher.launch_batch(plan):
            prov.fail(name, exc.code, str(exc))


def aws_instances(emulator: Ec2Emulator, cluster: str) -> list[Any]:
    return [
        n
        for n in emulator.driver().list_nodes(ex_filters={"tag:slurm-burst-cluster": cluster})
        if n.state != "terminated"
    ]


# -- the daemon path -------------------------------------------------------------------


@contextlib.contextmanager
def running(cfg: Config, tmp_path: Path, emulator: Ec2Emulator) -> Iterator[Provisioner]:
    """The daemon running (its heartbeat seen) until the block ends, the emulator's
    counts cleared before it started; then stopped, and its thread gone."""
    (tmp_path / "slurm").mkdir()
    d = daemon(cfg, tmp_path)
    runner = threading.Thread(target=d.run, name="daemon")
    emulator.calls.clear()
    runner.start()
    try:
        wait(lambda: d.prov.store.heartbeat() is not None, 30, "the daemon's heartbeat")
        yield d.prov
    finally:
        d.stop.set()
        runner.join(timeout=60)
    assert not runner.is_alive()


def test_64_node_resume_is_one_runinstances_and_one_tagged_instance_per_node(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = cfg_factory()
    with running(cfg, tmp_path, emulator) as prov:
        nodes = [f"aws-{i}" for i in range(1, 65)]
        invoke(["--config", cfg.source, "resume", "aws-[1-64]"])  # Slurm's ResumeProgram

        def tagged() -> list[Any]:
            live = aws_instances(emulator, cfg.cluster.name)
            return live if sum(NODE_TAG in n.extra["tags"] for n in live) == 64 else []

        live = wait(tagged, 60, "64 instances tagged with their node names")
        by_node = {n.extra["tags"][NODE_TAG]: n for n in live}
        assert sorted(by_node) == sorted(nodes) and len(live) == 64
        for name in nodes:
            rec = prov.store.node(name)
            assert rec is not None and rec.instance_id == by_node[name].id, name
            assert by_node[name].extra["tags"]["Name"] == name
            assert by_node[name].extra["tags"]["cost-center"] == "hpc-42"
            assert rec.state == NodeState.BOOTING  # no VM boots in an emulator
        assert emulator.calls["RunInstances"] == 1

        invoke(["--config", cfg.source, "resume", "aws-[1-64]"])  # asked again
        wait(lambda: not prov.store.pending_requests(), 30, "the duplicate resume handled")
        time.sleep(1.0)
        assert emulator.calls["RunInstances"] == 1
        assert len(aws_instances(emulator, cfg.cluster.name)) == 64


def test_a_launch_over_name_each_max_is_named_at_launch_with_no_call_per_instance(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    """A batch larger than ``daemon.name_each_max`` carries its nodes' hostlist as every
    instance's Name from RunInstances itself: no CreateTags at all; the state maps each
    node to its instance by launch index."""
    cfg = cfg_factory(daemon="name_each_max = 10")
    with running(cfg, tmp_path, emulator) as prov:
        invoke(["--config", cfg.source, "resume", "aws-[1-20]"])
        nodes = [f"aws-{i}" for i in range(1, 21)]
        wait(lambda: all(getattr(prov.store.node(n), "instance_id", "") for n in nodes), 60,
             "20 instances recorded")  # fmt: skip
        time.sleep(1.0)  # the naming thread would have started by now
        live = {n.id: n for n in aws_instances(emulator, cfg.cluster.name)}
        assert len(live) == 20
        for i, name in enumerate(nodes):
            rec = prov.store.node(name)
            assert rec is not None
            inst = live[rec.instance_id]
            assert inst.extra["tags"]["Name"] == "aws-[1-20]"
            assert inst.extra["launch_index"] == i and NODE_TAG not in inst.extra["tags"]
        assert emulator.calls["RunInstances"] == 1 and "CreateTags" not in emulator.calls


def test_batch_interrupted_after_the_call_is_adopted_not_launched_again(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    """The daemon died after RunInstances answered and before it recorded the instances."""
    cfg = cfg_factory()
    prov = provisioner(cfg, tmp_path)
    names = [f"aws-{i}" for i in range(1, 9)]
    requested(prov, *names)
    group = cfg.node_groups["cpu"]
    token = f"{cfg.cluster.name}-crash"
    prov.store.begin_batch(Batch(token, tuple(names), "aws", "c5.large", "cpu"))
    for n in names:
        prov.store.transition(
            n, NodeState.LAUNCHING, time.time(), token=token, provider="aws", size="c5.large"
        )
    made = prov.clouds["aws"].launch_many(prov.launcher.spec(group, names[0], "c5.large", token, 8))
    emulator.calls.clear()
    for n in reversed(names):  # the restarted daemon's workers, in any order
        prov.stopping.set()  # stop each drive after its first step (no VM will boot)
        prov.drive(n)
        prov.stopping.clear()
    assert emulator.calls["RunInstances"] == 0
    assert [prov.store.node(n).instance_id for n in names] == [i.id for i in made]  # type: ignore[union-attr]
    assert len(aws_instances(emulator, cfg.cluster.name)) == 8


def test_a_partial_batch_repeated_after_a_crash_sends_the_same_parameters(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    """A batch that asked for 8 with MinCount 4 got 5 (room for 5), and the daemon died
    before recording them: the restarted daemon repeats the call with the same token
    and the same MinCount, so EC2 answers the first call's 5 (another MinCount would be
    IdempotentParameterMismatch)."""
    cfg = cfg_factory()
    prov = provisioner(cfg, tmp_path)
    names = [f"aws-{i}" for i in range(1, 9)]
    requested(prov, *names)
    group = cfg.node_groups["cpu"]
    token = f"{cfg.cluster.name}-partial"
    prov.store.begin_batch(Batch(token, tuple(names), "aws", "c5.large", "cpu", least=4))
    for n in names:
        prov.store.transition(
            n, NodeState.LAUNCHING, time.time(), token=token, provider="aws", size="c5.large"
        )
    emulator.limit("c5.large", 5)
    made = prov.clouds["aws"].launch_many(
        prov.launcher.batch_spec(group, names, Candidate(0, "aws", "c5.large"), token, 4)
    )
    assert len(made) == 5
    emulator.calls.clear()
    prov.stopping.set()  # stop the drive after its first step (no VM will boot)
    prov.drive(names[0])
    prov.stopping.clear()
    assert emulator.calls["RunInstances"] == 1  # repeated, answered from the token
    got = [getattr(prov.store.node(n), "instance_id", "") for n in names]
    assert sorted(i for i in got if i) == sorted(i.id for i in made)
    assert len(aws_instances(emulator, cfg.cluster.name)) == 5


def test_clienttoken_makes_a_repeated_runinstances_return_the_same_instances(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = cfg_factory()
    prov = provisioner(cfg, tmp_path)
    spec = prov.launcher.spec(
        cfg.node_groups["cpu"], "aws-1", "c5.large", f"{cfg.cluster.name}-tok", 3
    )
    cloud = prov.clouds["aws"]
    first, again = cloud.launch_many(spec), cloud.launch_many(spec)
    assert [i.id for i in first] == [i.id for i in again]
    assert len(aws_instances(emulator, cfg.cluster.name)) == 3


# -- requests ----------------------------------------------------------------------------


def test_spot_group_asks_for_spot_capacity(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = cfg_factory(spot=True)
    prov = provisioner(cfg, tmp_path)
    inst = prov.clouds["aws"].launch(
        prov.launcher.spec(cfg.node_groups["cpu"], "aws-3", "c5.large", f"{cfg.cluster.name}-spot")
    )
    node = emulator.driver().list_nodes(ex_node_ids=[inst.id])[0]
    assert node.extra["instance_lifecycle"] == "spot"
    assert node.extra["tags"][NODE_TAG] == "aws-3"


def test_listing_is_filtered_by_our_cluster_tag_and_terminate_is_idempotent(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = cfg_factory()
    prov = provisioner(cfg, tmp_path)
    cloud = prov.clouds["aws"]
    ours = cloud.launch(
        prov.launcher.spec(cfg.node_groups["cpu"], "aws-4", "c5.large", f"{cfg.cluster.name}-l")
    )
    other = LibcloudCloud("other", emulator.driver())
    other.launch(
        LaunchSpec("x-1", "someone-else", "g", "c5.large", "ami-12345678", "o-1", _pub(), "")
    )
    emulator.calls.clear()
    listed = cloud.list_instances(cfg.cluster.name)
    assert [i.id for i in listed] == [ours.id]
    assert emulator.calls["DescribeInstances"] == 1  # the filter is the server's
    cloud.terminate(ours.id)
    cloud.terminate(ours.id)  # already gone: done
    assert cloud.get(ours.id).state == "terminated"  # type: ignore[union-attr]


# -- errors ------------------------------------------------------------------------------

ERRORS = [
    ("InsufficientInstanceCapacity", 500, CapacityError),
    ("InsufficientHostCapacity", 500, CapacityError),
    ("SpotMaxPriceTooLow", 400, CapacityError),
    ("RequestLimitExceeded", 503, ThrottledError),
    ("AuthFailure", 401, AuthError),
    ("UnauthorizedOperation", 403, AuthError),
    ("InstanceLimitExceeded", 400, QuotaError),
]


@pytest.mark.parametrize(("code", "http", "kind"), ERRORS, ids=[e[0] for e in ERRORS])
def test_ec2_error_is_typed_with_its_code_and_named_in_the_node_reason(
    code: str,
    http: int,
    kind: type[CloudError],
    emulator: Ec2Emulator,
    cfg_factory: Callable[..., Config],
    tmp_path: Path,
) -> None:
    cfg = cfg_factory()
    raw = LibcloudCloud("aws", cloud_driver(cfg.providers["aws"]))
    spec = LaunchSpec(
        "aws-5", cfg.cluster.name, "cpu", "c5.large", "ami-12345678", f"e-{code}", _pub(), ""
    )
    emulator.inject("RunInstances", code, http)
    with pytest.raises(kind) as caught:
        raw.launch(spec)
    assert caught.value.code == code

    # through the daemon's path: the node fails with the code in its Slurm reason
    # (capacity errors first fall back through every size: inject one per size), but
    # a throttled launch waits its turn and is made (the node boots)
    slurm = FakeScheduler.cloud_nodes(cfg.node_groups["cpu"].node_names())
    prov = provisioner(cfg, tmp_path, slurm)
    requested(prov, "aws-5")
    times = 2 if kind is CapacityError else (5 if kind is ThrottledError else 1)
    emulator.inject("RunInstances", code, http, times=times)
    before = emulator.calls["RunInstances"]
    if kind is ThrottledError:
        # unbudgeted: five throttled answers in a row would cut the rate to its floor
        # (test_read_budget), and this test is about where the error goes
        prov.clouds["aws"].budget.budgets = ApiBudgets(None)  # type: ignore[attr-defined]
        looks = 0
        while (rec := prov.store.node("aws-5")) and rec.state != NodeState.BOOTING:
            with pytest.raises(Later):  # the throttled launch, then the boot, wait
                prov.drive("aws-5", blocking=False)
            looks += 1
            assert looks < 5
        assert rec is not None and rec.instance_id and not rec.error
        assert emulator.calls["RunInstances"] - before == times + 1
        assert not [u for u in slurm.updates if u.get("state") == "down"]
        prov.store.update("aws-5", want=Want.DOWN)
        prov.drive("aws-5")
        assert aws_instances(emulator, cfg.cluster.name) == []
        return
    prov.drive("aws-5")
    rec = prov.store.node("aws-5")
    assert rec is not None and rec.error == code and rec.state == NodeState.TERMINATED
    down = [u for u in slurm.updates if u.get("state") == "down"]
    assert down and f"(Code:{code})" in down[0]["reason"]
    assert down[0]["reason"] == reason(code, rec.message)
    assert emulator.calls["RunInstances"] - before == times
    assert aws_instances(emulator, cfg.cluster.name) == []


def test_throttled_launch_is_retried_with_the_same_token_and_makes_one_instance(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = cfg_factory()
    prov = provisioner(cfg, tmp_path)
    requested(prov, "aws-6")
    emulator.inject("RunInstances", "RequestLimitExceeded", 503, times=2)
    launch_batch(prov, ["aws-6"])  # one node: still the batch path, one RunInstances
    prov.stopping.set()
    prov.drive("aws-6")
    rec = prov.store.node("aws-6")
    assert rec is not None and rec.state == NodeState.BOOTING, rec
    assert len(aws_instances(emulator, cfg.cluster.name)) == 1


def test_capacity_error_falls_the_batch_back_to_the_next_size(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = cfg_factory()
    prov = provisioner(cfg, tmp_path)
    names = [f"aws-{i}" for i in range(10, 18)]
    requested(prov, *names)
    emulator.inject("RunInstances", "InsufficientInstanceCapacity", 500)
    emulator.calls.clear()
    launch_batch(prov, names)
    assert emulator.calls["RunInstances"] == 2  # c5.large refused, c5.xlarge made
    assert ("aws", "c5.large") in prov.store.unavailable(time.time())
    live = aws_instances(emulator, cfg.cluster.name)
    assert len(live) == 8 and {n.extra["instance_type"] for n in live} == {"c5.xlarge"}
    for n in names:
        rec = prov.store.node(n)
        assert rec is not None and (rec.state, rec.size) == (NodeState.BOOTING, "c5.xlarge")
    sizes = {r["node"]: r["size"] for r in sql_ledger(cfg).instances()}
    assert {sizes[n] for n in names} == {"c5.xlarge"}


_KEY: list[str] = []


def _pub() -> str:
    """An SSH public key (made once)."""
    if not _KEY:
        import tempfile

        _KEY.append(generate_key(os.path.join(tempfile.mkdtemp(), "id_ed25519")))
    return _KEY[0]


def mixed_config(cfg_factory: Callable[..., Config], monkeypatch: pytest.MonkeyPatch) -> Config:
    """The test group on on-prem OpenStack first (recorded responses), EC2 next."""
    cfg = cfg_factory()
    creds = Path(cfg.source).parent / "onprem-credentials.toml"
    creds.write_text(
        'key = "burst"\nsecret = "pw"\nex_force_auth_url = "https://keystone.example.org:5000"\n'
        'ex_tenant_name = "hpc"\nex_force_auth_token = "tok"\n'  # a pre-issued Keystone token
    )
    creds.chmod(0o600)
    text = Path(cfg.source).read_text()
    text = text.replace('providers = ["aws"]', 'providers = ["onprem", "aws"]')
    text = text.replace(
        'sizes = ["c5.large", "c5.xlarge"]', 'sizes = ["onprem:g1.gpu", "aws:c5.large"]'
    )
    text = text.replace("price_per_hour = {", 'price_per_hour = { "g1.gpu" = 0.5,')
    text = text.replace(', "c5.xlarge" = 0.17', "")
    text += (
        '\n[providers.onprem]\ndriver = "openstack"\nregion = "RegionOne"\n'
        f'options = {{ ex_force_base_url = "{NOVA}" }}\n'
        f'credentials = {{ file = "{creds}" }}\n'
        'network = "5c1e4a3e-0000-4000-8000-00000000a001"\n'
    )
    Path(cfg.source).write_text(text)
    cfg = load_config(Path(cfg.source))
    assert cfg.node_groups["cpu"].candidates() == [("onprem", "g1.gpu"), ("aws", "c5.large")]
    return cfg


@contextlib.contextmanager
def nova(emulator: Ec2Emulator) -> Iterator[Http]:
    """OpenStack's Nova answered from recorded responses (flavors, key pairs), EC2 passed
    through to the emulator; the caller adds the server calls."""
    import responses

    with responses.RequestsMock(
        assert_all_requests_are_fired=False,
        passthru_prefixes=(f"http://127.0.0.1:{emulator.port}",),
    ) as mock:
        http = Http(mock)
        http.on("GET", rf"{NOVA}/flavors/detail", "openstack/flavors_detail.json")
        http.on("GET", rf"{NOVA}/os-keypairs$", {"keypairs": []})
        http.on("POST", rf"{NOVA}/os-keypairs$", "openstack/keypair_post.json")
        yield http


def test_capacity_on_the_first_provider_falls_back_to_the_next_provider(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """On-prem OpenStack first (its scheduler finds no host), EC2 next; the node's final
    provider and size are what the ledger records."""
    cfg = mixed_config(cfg_factory, monkeypatch)
    prov = provisioner(cfg, tmp_path)
    requested(prov, "aws-40")
    emulator.calls.clear()
    with nova(emulator) as http:
        http.on("POST", rf"{NOVA}/servers$", "openstack/error_no_valid_host.json", status=500)
        prov.stopping.set()  # stop after the launch: nothing boots here
        prov.drive("aws-40")
    rec = prov.store.node("aws-40")
    assert rec is not None and (rec.state, rec.provider, rec.size) == (
        NodeState.BOOTING,
        "aws",
        "c5.large",
    )
    assert ("onprem", "g1.gpu") in prov.store.unavailable(time.time())
    assert http.body("POST", r"/servers$")["server"]["flavorRef"] == "f-gpu-1"
    assert emulator.calls["RunInstances"] == 1
    row = next(r for r in sql_ledger(cfg).instances() if r["node"] == "aws-40")
    assert (row["provider"], row["size"], row["instance_id"]) == (
        "aws",
        "c5.large",
        rec.instance_id,
    )


def test_an_instance_put_in_error_for_want_of_capacity_cools_its_size(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Nova accepts the server, then its scheduler finds no host (asynchronously): the
    node fails with NoValidHost, and the node's next resume lands on the next provider."""
    import json as _json

    cfg = mixed_config(cfg_factory, monkeypatch)
    failed = _json.loads((FIXTURES / "openstack" / "servers_detail.json").read_text())
    server = failed["servers"][0]
    server.update(status="ERROR", addresses={},
                  fault={"code": 500, "message": "No valid host was found. There are not "
                         "enough hosts available.", "created": "2026-11-21T10:00:03Z"})  # fmt: skip
    slurm = FakeScheduler.cloud_nodes(cfg.node_groups["cpu"].node_names())
    prov = provisioner(cfg, tmp_path, slurm)
    requested(prov, "aws-41")
    with nova(emulator) as http:
        http.on("POST", rf"{NOVA}/servers$", "openstack/server_post.json", status=202)
        http.on("GET", rf"{NOVA}/servers/srv-0001$", "openstack/server_get.json")
        http.on("GET", rf"{NOVA}/servers/detail", failed)
        http.on("DELETE", rf"{NOVA}/servers/srv-0001$", None, status=204)
        prov.drive("aws-41")  # launch on onprem, boot: ERROR, fail, tear down
    rec = prov.store.node("aws-41")
    assert rec is not None and (rec.state, rec.error) == (NodeState.TERMINATED, "NoValidHost")
    assert ("onprem", "g1.gpu") in prov.store.unavailable(time.time())
    down = [u for u in slurm.updates if u.get("state") == "down"]
    assert down and "(Code:NoValidHost)" in down[0]["reason"]
    assert any(m == "DELETE" for m, _, _ in http.sent)  # the failed server is deleted

    # Slurm resumes the node again: the cooling size is skipped, EC2 it is
    prov.store.transition("aws-41", NodeState.REQUESTED, time.time(), want=Want.UP, launch_seq=2)
    prov.stopping.set()
    prov.drive("aws-41")
    rec = prov.store.node("aws-41")
    assert rec is not None and (rec.state, rec.provider) == (NodeState.BOOTING, "aws")


class TestEc2CloudContract(CloudContract):
    """The Cloud contract on libcloud's EC2 driver against the emulator (the fake passes
    it too). Instances never run in an emulator: no host-key test here."""

    boots = False

    @pytest.fixture()
    def cluster(self) -> str:
        return f"contract{time.time_ns() % 10**9}"

    @pytest.fixture()
    def cloud(self, emulator: Ec2Emulator) -> LibcloudCloud:
        return LibcloudCloud("aws", emulator.driver(), batch=500)

    @pytest.fixture()
    def make_spec(self, cluster: str) -> Callable[..., LaunchSpec]:
        def make(node: str, token: str, count: int = 1) -> LaunchSpec:
            return LaunchSpec(node, cluster, "cpu", "c5.large", "ami-12345678", token, _pub(),
                              "#!/bin/sh\n", count=count)  # fmt: skip

        return make

    @pytest.fixture()
    def settle(self) -> Callable[[], None]:
        return lambda: time.sleep(0.2)


def test_a_partial_launch_serves_whole_jobs_and_the_rest_falls_back(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    """EC2 grants 12 of 16 c5.large: one RunInstances (MinCount = the smallest job)
    makes 12, which go to three whole jobs of four; the fourth job moves whole to
    c5.xlarge; the short size cools down."""
    cfg = cfg_factory()
    prov = provisioner(cfg, tmp_path)
    names = [f"aws-{i}" for i in range(1, 17)]
    jobs = [{"job_id": j, "nodes": f"aws-[{4 * j - 3}-{4 * j}]"} for j in range(1, 5)]
    requested(prov, *names, jobs=jobs)
    emulator.clear()
    emulator.limit("c5.large", 12)
    launch_batch(prov, names)
    assert emulator.calls["RunInstances"] == 2
    sizes = [prov.store.node(n).size for n in names]  # type: ignore[union-attr]
    assert sizes == ["c5.large"] * 12 + ["c5.xlarge"] * 4
    live = aws_instances(emulator, cfg.cluster.name)
    assert sorted(n.extra["instance_type"] for n in live) == ["c5.large"] * 12 + ["c5.xlarge"] * 4
    assert ("aws", "c5.large") in prov.store.unavailable(time.time())


def test_a_partial_launch_below_the_smallest_job_makes_nothing(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = cfg_factory()
    prov = provisioner(cfg, tmp_path)
    names = [f"aws-{i}" for i in range(1, 9)]
    jobs = [{"job_id": 1, "nodes": "aws-[1-4]"}, {"job_id": 2, "nodes": "aws-[5-8]"}]
    requested(prov, *names, jobs=jobs)
    emulator.clear()
    emulator.limit("c5.large", 3)  # EC2 has room for 3; MinCount is 4
    launch_batch(prov, names)
    assert emulator.calls["RunInstances"] == 2
    live = aws_instances(emulator, cfg.cluster.name)
    assert sorted(n.extra["instance_type"] for n in live) == ["c5.xlarge"] * 8
    assert prov.store.unavailable(time.time())[("aws", "c5.large")][1] == (
        "InsufficientInstanceCapacity"
    )
