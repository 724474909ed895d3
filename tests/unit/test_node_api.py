"""Direct tunnels between cloud nodes: the daemon's node API (who may ask, what it is
told) and the node agent's reconciliation of its direct interface, on fakes. The lab
runs both for real (tests/lab/test_x_mesh_direct.py)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.core.mesh import NodeLink, Refused, direct_peers
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.node import agent
from slurm_burst.services.nodeapi import NodeApi, NodeApiSettings
from tests.conftest import lab_config_in
from tests.fakes.clock import FakeClock
from tests.fakes.store import MemoryStore

pytestmark = pytest.mark.unit

SUBNET = "10.77.0.0/24"
PATH = (NodeState.LAUNCHING, NodeState.BOOTING, NodeState.BOOTSTRAPPING, NodeState.JOINED,
        NodeState.TERMINATING, NodeState.TERMINATED)  # fmt: skip


def api_with(tmp_path: Path, *nodes: tuple[str, NodeState, str]) -> tuple[NodeApi, MemoryStore]:
    """The API over the lab config and ``nodes`` (name, state, provider) with keys and
    addresses as a bootstrap leaves them."""
    cfg = lab_config_in(tmp_path)
    store = MemoryStore()
    for i, (name, state, provider) in enumerate(nodes, start=2):
        group = cfg.fleet.group_of(name)
        assert group is not None, name
        store.transition(name, NodeState.REQUESTED, 0.0, group=group.name, want=Want.UP)
        addr = store.allocate_address(name, SUBNET, 0.0)
        for step in PATH[: PATH.index(state) + 1]:
            store.transition(name, step, 0.0)
        store.update(name, provider=provider, wg_pubkey=f"key{i}=", mesh_addr=addr)
    settings = NodeApiSettings(cfg.fleet, SUBNET)
    return NodeApi(settings, store, FakeClock()), store


def addr(store: MemoryStore, node: str) -> str:
    return store.addresses()[node]


def test_a_node_is_offered_to_its_peers_once_its_agent_says_where_it_listens(
    tmp_path: Path,
) -> None:
    api, store = api_with(tmp_path, ("burst-dir-1", NodeState.JOINED, "lab"),
                          ("burst-dir-2", NodeState.BOOTSTRAPPING, "lab"))  # fmt: skip
    first = api.peers(addr(store, "burst-dir-1"), "10.251.0.11:51820")
    assert first["peers"] == [] and first["node"] == "burst-dir-1"
    api.clock.sleep(1.1)  # past the records' cache
    second = api.peers(addr(store, "burst-dir-2"), "10.251.0.12:51820")
    assert second["peers"] == [{"node": "burst-dir-1", "key": "key2=",
                                "address": addr(store, "burst-dir-1"),
                                "endpoint": "10.251.0.11:51820"}]  # fmt: skip
    again = api.peers(addr(store, "burst-dir-1"), "10.251.0.11:51820")
    assert [p["node"] for p in again["peers"]] == ["burst-dir-2"]


@pytest.mark.parametrize(
    ("source", "endpoint", "status"),
    [
        ("10.77.0.200", "10.251.0.11:51820", 403),  # no node has that address
        ("burst-cpu-1", "10.251.0.11:51820", 403),  # a node of a group that uses the hub
        ("burst-dir-2", "10.251.0.11:51820", 403),  # terminated
        ("burst-dir-1", "10.77.0.9:51820", 400),  # inside the mesh
        ("burst-dir-1", "10.251.0.11:99999", 400),
        ("burst-dir-1", "10.251.0.11", 400),
        ("burst-dir-1", "x" * 5000, 400),
    ],
    ids=["stranger", "hub-group", "terminated", "endpoint-in-mesh", "bad-port", "no-port",
         "garbage"],
)  # fmt: skip
def test_what_the_api_refuses(tmp_path: Path, source: str, endpoint: str, status: int) -> None:
    api, store = api_with(tmp_path, ("burst-dir-1", NodeState.JOINED, "lab"),
                          ("burst-dir-2", NodeState.TERMINATED, "lab"),
                          ("burst-cpu-1", NodeState.JOINED, "lab"))  # fmt: skip
    known = store.addresses()
    with pytest.raises(Refused) as caught:
        api.peers(known.get(source, source), endpoint)
    assert caught.value.status == status, caught.value


def test_direct_peers_stay_within_a_provider_profile() -> None:
    me = NodeLink("a", "aws-east", "k1=", "10.77.0.2", "10.0.0.2:51820")
    others = [
        me,
        NodeLink("b", "aws-east", "k2=", "10.77.0.3", "10.0.0.3:51820"),
        NodeLink("c", "aws-west", "k3=", "10.77.0.4", "10.1.0.4:51820"),
        NodeLink("d", "aws-east", "k4=", "10.77.0.5", ""),  # its agent has not said
    ]
    assert [p.node for p in direct_peers(me, others)] == ["b"]


# -- the agent's reconciliation of its direct interface ------------------------------


class FakeWg:
    """``wg`` and ``ip`` as the agent calls them, on an interface's peers and routes."""

    def __init__(self) -> None:
        self.peers: dict[str, dict[str, Any]] = {}
        self.routes: set[str] = set()
        self.ran: list[tuple[str, ...]] = []

    def wg(self, *argv: str) -> str:
        self.ran.append(("wg", *argv))
        if argv[0] == "show" and argv[2] == "dump":
            lines = ["priv\tpub\t51820\toff"]
            for key, p in self.peers.items():
                allowed = ",".join(p["allowed"]) or "(none)"
                lines.append(
                    f"{key}\t(none)\t{p['endpoint']}\t{allowed}\t{p['handshake']}\t0\t0\t25"
                )
            return "\n".join(lines) + "\n"
        if argv[0] == "set" and argv[2] == "peer":
            key, rest = argv[3], list(argv[4:])
            if rest == ["remove"]:
                self.peers.pop(key, None)
                return ""
            p = self.peers.setdefault(key, {"allowed": [], "endpoint": "", "handshake": 0})
            opts = dict(zip(rest[::2], rest[1::2], strict=True))
            p["endpoint"] = opts.get("endpoint", p["endpoint"])
            if "allowed-ips" in opts:
                p["allowed"] = [a for a in opts["allowed-ips"].split(",") if a]
            return ""
        raise AssertionError(argv)

    def ip(self, *argv: str) -> str:
        self.ran.append(("ip", *argv))
        if argv[:3] == ("-o", "route", "show"):
            return "".join(f"{r} dev wg-burst-d scope link\n" for r in sorted(self.routes))
        if argv[:2] == ("route", "replace"):
            self.routes.add(argv[2].removesuffix("/32"))
            return ""
        if argv[:2] == ("route", "del"):
            self.routes.discard(argv[2].removesuffix("/32"))
            return ""
        raise AssertionError(argv)


def said(*peers: tuple[str, str, str]) -> dict[str, Any]:
    listed = [{"node": n, "key": k, "address": a, "endpoint": "10.251.0.9:51820"}
              for n, k, a in peers]  # fmt: skip
    return {"hub": "hubkey=", "peers": listed}


def test_the_agent_routes_a_peer_directly_only_once_it_has_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeWg()
    monkeypatch.setattr(agent, "wg", fake.wg)
    monkeypatch.setattr(agent, "ip", fake.ip)
    now = time.time()
    b = ("burst-dir-2", "kb=", "10.77.0.3")
    assert agent.sync("wg-burst-d", "10.77.0.2", said(b), now) == [
        "added burst-dir-2 at 10.251.0.9:51820"]  # fmt: skip
    assert fake.peers["kb="]["allowed"] == ["10.77.0.3/32"] and not fake.routes
    assert agent.sync("wg-burst-d", "10.77.0.2", said(b), now) == []  # no handshake yet
    fake.peers["kb="]["handshake"] = int(now) - 2
    assert agent.sync("wg-burst-d", "10.77.0.2", said(b), now) == ["burst-dir-2 now direct"]
    assert fake.routes == {"10.77.0.3"}
    assert ("ip", "route", "replace", "10.77.0.3/32", "dev", "wg-burst-d", "src",
            "10.77.0.2") in fake.ran  # fmt: skip
    fake.peers["kb="]["handshake"] = int(now) - 600  # it stopped answering
    assert agent.sync("wg-burst-d", "10.77.0.2", said(b), now) == [
        "burst-dir-2 back through the hub (no handshake)"]  # fmt: skip
    assert not fake.routes
    fake.peers["kb="]["handshake"] = int(now)
    agent.sync("wg-burst-d", "10.77.0.2", said(b), now)
    assert agent.sync("wg-burst-d", "10.77.0.2", said(), now) == ["removed kb="]
    assert not fake.peers and not fake.routes


def test_the_agent_survives_a_bad_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="no peer list"):
        monkeypatch.setattr(urllib.request, "urlopen", _answering({"peers": "x"}))
        agent.ask("http://10.77.0.1:51821", "10.251.0.9:51820")


def _answering(body: object) -> Any:
    class R:
        def __enter__(self) -> R:
            return self

        def __exit__(self, *a: object) -> None:
            return None

        def read(self, n: int) -> bytes:
            return json.dumps(body).encode()

    return lambda url, timeout: R()
