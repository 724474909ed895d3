"""The runtime step of a join on in-memory fakes: a node whose runtime differs from its
group's reference beyond the rule is refused before anything of the site reaches it
(no mesh address, no munge key, no slurmd: no job), one case per field class; one within
the rule joins; the node's manifest is kept for ``runtime diff``; a reference that does
not read refuses every node of the group with its own code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.core.nodestate import NodeState
from slurm_burst.runtimeref import node_manifest_path
from tests.fakes.world import World, make_world

N = "burst-cpu-1"
REFERENCE: dict[str, Any] = {
    "slurm_burst_runtime": 1,
    "host": "op1",
    "python_path": "/usr/bin/python3",
    "os": "debian 12",
    "kernel": "6.1.0-18-amd64",
    "glibc": "2.36",
    "driver": "550.54.15",
    "cuda_driver": "12.4",
    "cuda_runtime": "12.4",
    "nccl": "2.19.3",
    "mpi": "openmpi 4.1.4",
    "python": "3.11.2",
    "libraries": {"libmpi.so.40": "libmpi.so.40.30.4 " + "a" * 64},
    "packages": {"numpy": "1.24.2", "mpi4py": "3.1.4"},
}


def world(tmp_path: Path, rule: str = "compatible", write: bool = True) -> World:
    ref = tmp_path / "onprem.json"
    tmp_path.mkdir(exist_ok=True)
    if write:
        ref.write_text(json.dumps(REFERENCE))
    return make_world(tmp_path, edits=[(
        'price_per_hour = { "ns.cpu2" = 0.085, "ns.cpu4" = 0.17 }',
        'price_per_hour = { "ns.cpu2" = 0.085, "ns.cpu4" = 0.17 }\n'
        f'runtime_manifest = "{ref}"\nruntime_rule = "{rule}"',
    )])  # fmt: skip


# (what the node says differently, the field the refusal names): a case per field class
REFUSED = [
    ({"os": "debian 13"}, "os: debian 12 -> debian 13"),
    ({"kernel": "6.6.15-amd64"}, "kernel: 6.1.0-18-amd64 -> 6.6.15-amd64"),
    ({"glibc": "2.31"}, "glibc: 2.36 -> 2.31"),
    ({"driver": "535.104.05"}, "driver: 550.54.15 -> 535.104.05"),
    ({"cuda_driver": "12.2"}, "cuda_driver: 12.4 -> 12.2"),
    ({"cuda_runtime": "11.8"}, "cuda_runtime: 12.4 -> 11.8"),
    ({"nccl": "2.21.5"}, "nccl: 2.19.3 -> 2.21.5"),
    ({"mpi": "openmpi 5.0.7"}, "mpi: openmpi 4.1.4 -> openmpi 5.0.7"),
    ({"python": "3.13.5"}, "python: 3.11.2 -> 3.13.5"),
    (
        {"libraries": {"libmpi.so.40": "libmpi.so.40.40.7 " + "b" * 64}},
        "library:libmpi.so.40: libmpi.so.40.30.4 " + "a" * 64 + " -> libmpi.so.40.40.7",
    ),
    ({"packages": {"numpy": "2.2.4", "mpi4py": "3.1.4"}}, "package:numpy: 1.24.2 -> 2.2.4"),
    ({"nccl": None}, "nccl: 2.19.3 -> (none)"),
]


@pytest.mark.parametrize(("changes", "said"), REFUSED, ids=[c[1].split(":")[0] for c in REFUSED])
def test_a_node_whose_runtime_differs_is_refused_before_anything_of_the_site(
    tmp_path: Path, changes: dict[str, Any], said: str
) -> None:
    w = world(tmp_path)
    w.connector.runtime = changes
    w.request(N)
    rec = w.prov.drive(N)
    assert rec is not None and rec.state == NodeState.TERMINATED
    assert rec.error == "RuntimeMismatch" and said in rec.message, rec.message
    node = next(iter(w.connector.nodes.values()))
    assert not node.wg_pub and not node.munged and not node.slurmd  # no job can reach it
    assert "/etc/munge/munge.key" not in node.files
    steps = [a[2] for a in node.ran if a[:1] == ["sh"]]
    assert "runtime-capture" in steps and "wg-key" not in steps
    [event] = [e for e in w.store.events() if e["event"] == "node.runtime_mismatch"]
    assert event["node"] == N and said in event["detail"]
    down = next(u for u in w.slurm.updates if u["state"] == "down")
    assert down["reason"].endswith("(Code:RuntimeMismatch)") and said[:20] in down["reason"]
    assert w.ledger.of(N)[-2:] == ["failed", "terminated"]
    [failed] = [e for e in w.ledger.events if e.node == N and e.event == "failed"]
    assert failed.detail.startswith("RuntimeMismatch: ") and said[:20] in failed.detail
    kept = json.loads(node_manifest_path(w.cfg.daemon.state_dir, N).read_text())
    assert kept["host"] == "op1" and kept["source"] == "node"


def test_a_node_within_the_rule_joins_and_exact_refuses_it(tmp_path: Path) -> None:
    newer: dict[str, object] = {"driver": "555.42.02", "glibc": "2.41", "nccl": "2.19.4"}
    w = world(tmp_path)
    w.connector.runtime = newer
    w.request(N)
    rec = w.prov.drive(N)
    assert rec is not None and rec.state == NodeState.JOINED, rec
    node = next(iter(w.connector.nodes.values()))
    assert (
        node.files["/etc/slurm-burst/runtime-reference.json"][0] == json.dumps(REFERENCE).encode()
    )
    shipped = (Path(__file__).parents[2] / "slurm_burst/node/runtime.py").read_bytes()
    assert node.files["/etc/slurm-burst/runtime.py"] == (shipped, 0o644, None)

    strict = world(tmp_path / "exact", rule="exact")
    strict.connector.runtime = newer
    strict.request(N)
    rec = strict.prov.drive(N)
    assert rec is not None and rec.error == "RuntimeMismatch"
    assert rec.message.startswith("3 field(s) differ beyond 'exact'")


@pytest.mark.parametrize(
    ("said", "why"),
    [("garbage", "unreadable"), ('{"slurm_burst_runtime": 1, "os": 12}', "must be text")],
)
def test_a_node_that_answers_garbage_is_refused(tmp_path: Path, said: str, why: str) -> None:
    w = world(tmp_path)
    w.request(N)
    real = w.connector.node_at

    def node_at(host: str, keys: list[tuple[str, str]]) -> Any:
        node = real(host, keys)
        step = node._step

        def lying(name: str, args: list[str]) -> str:
            return said + "\n" if name == "runtime-capture" else step(name, args)

        node._step = lying  # type: ignore[method-assign,assignment]
        return node

    w.connector.node_at = node_at  # type: ignore[method-assign,assignment]
    rec = w.prov.drive(N)
    assert rec is not None and rec.error == "RuntimeMismatch" and why in rec.message


def test_a_reference_that_does_not_read_refuses_the_groups_nodes_with_its_own_code(
    tmp_path: Path,
) -> None:
    w = world(tmp_path, write=False)
    w.request(N)
    rec = w.prov.drive(N)
    assert rec is not None and rec.error == "RuntimeReference"
    assert "onprem.json" in rec.message and "No such file" in rec.message
    (tmp_path / "onprem.json").write_text('{"slurm_burst_runtime": 7}')
    w.request("burst-cpu-2")
    rec = w.prov.drive("burst-cpu-2")
    assert rec is not None and rec.error == "RuntimeReference" and "schema 1" in rec.message


def test_a_reference_that_is_not_json_is_a_runtime_reference_error(tmp_path: Path) -> None:
    """A malformed reference (not JSON at all) reads as ManifestError, so the join says
    RuntimeReference and config check says which file, rather than BadJson escaping."""
    from slurm_burst.core.runtime import ManifestError
    from slurm_burst.runtimeref import read_manifest

    for body in ("{not json", "[" * 10_000, '{"os": NaN}'):
        bad = tmp_path / "ref.json"
        bad.write_text(body)
        with pytest.raises(ManifestError, match="runtime manifest"):
            read_manifest(bad)
