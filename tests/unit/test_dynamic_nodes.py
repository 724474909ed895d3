"""Dynamic node groups through the daemon, on the fake world: each reconcile pass makes
the group's first max_nodes nodes in Slurm, bursts on them as on declared ones, deletes
those past a lowered limit only once released, deletes a removed group's strays, and
tears down an instance whose node was deleted under it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from slurm_burst_lab import slurmfeatures

from slurm_burst.config.load import check_config
from slurm_burst.config.validate import validate
from slurm_burst.core.dynamic import DynamicPlan, deletable, plan_dynamic, strays
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.slurm import SlurmNode
from slurm_burst.services.slurmconf import RenderError, check_rendered, render
from tests.conftest import LAB_CONFIG, lab_config_in
from tests.fakes.world import World, make_world

DYN = "\n" + slurmfeatures.group_toml(count=6, max_nodes=3)
ROOM = ("[slurm]\n", "[slurm]\nmax_node_count = 200\n")
NAMES = [f"burst-dyn-{i}" for i in range(1, 7)]


@pytest.fixture()
def w(tmp_path: Path) -> World:
    world = make_world(tmp_path, extra_config=DYN, edits=[ROOM], slurm_release="24.11")
    world.slurm.dynamic_partitions["sbdyn_dyn"] = ("burst-dyn",)
    return world


def held(w: World) -> list[str]:
    return [n.name for n in w.slurm.nodes() if n.name.startswith("burst-dyn-")]


def with_limit(w: World, limit: int) -> None:
    """The daemon as restarted on a config whose dyn group has max_nodes ``limit``."""
    groups = {
        **w.cfg.node_groups,
        "dyn": dataclasses.replace(w.cfg.node_groups["dyn"], max_nodes=limit),
    }
    fleet = dataclasses.replace(w.cfg, node_groups=groups).fleet
    w.daemon.reconciler.groups.groups = groups
    w.daemon.reconciler.fleet = fleet


def test_the_first_pass_creates_the_groups_nodes_in_slurm_as_its_nodeset_names_them(
    w: World,
) -> None:
    assert held(w) == []
    report = w.daemon.reconciler.pass_once()
    assert report.actions.get("create_nodes") == 3, report.errors
    assert held(w) == NAMES[:3]
    names, settings = w.slurm.created[0]
    assert names == NAMES[:3]
    assert settings == {"State": "CLOUD", "CPUs": "2", "RealMemory": "1000",
                        "Features": "cloud,cpu,sbdyn_dyn"}  # fmt: skip
    node = w.slurm.node(NAMES[0])
    assert node.powered_down and node.is_cloud and node.partitions == ("burst-dyn",)
    again = w.daemon.reconciler.pass_once()  # nothing missing: no second create
    assert "create_nodes" not in again.actions and len(w.slurm.created) == 1
    events = [e for e in w.store.events() if e["event"] == "dynamic.create_nodes"]
    assert [e["detail"] for e in events] == ["dyn: burst-dyn-[1-3]"]


def test_a_job_bursts_onto_dynamic_nodes_as_onto_declared_ones(w: World) -> None:
    w.daemon.reconciler.pass_once()
    w.slurm.update_nodes(NAMES[:2], state="power_up")
    w.store.add_request("resume", NAMES[:2], [{"job_id": 7, "nodes": "burst-dyn-[1-2]"}],
                        w.clock.now())  # fmt: skip
    w.settle()
    assert [w.rec(n).state for n in NAMES[:2]] == [NodeState.JOINED] * 2
    assert {w.rec(n).group for n in NAMES[:2]} == {"dyn"}
    assert len(w.cloud.live()) == 2
    # slurmd -Z with the node's settings: a name in no slurm.conf line needs them
    started = [argv for node in w.connector.nodes.values() for argv in node.ran
               if "slurmd-start" in argv]  # fmt: skip
    assert len(started) == 2
    for argv in started:
        at = argv.index("-Z")
        assert argv[at : at + 3] == [
            "-Z",
            "--conf",
            "CPUs=2 RealMemory=1000 Features=cloud,cpu,sbdyn_dyn",
        ]
        assert "--instance-id" in argv  # 24.11: the instance's flags after them


def test_a_lowered_limit_deletes_only_what_holds_no_instance_and_no_job(w: World) -> None:
    w.daemon.reconciler.pass_once()
    w.slurm.update_nodes(NAMES[1:2], state="power_up")
    w.store.add_request("resume", NAMES[1:2], [], w.clock.now())
    w.settle()
    assert w.rec(NAMES[1]).state == NodeState.JOINED
    with_limit(w, 0)
    report = w.daemon.reconciler.pass_once()
    assert report.actions.get("delete_nodes") == 2, report.errors
    assert held(w) == [NAMES[1]]  # up, with its instance: kept until released
    assert w.slurm.deleted == [[NAMES[0], NAMES[2]]]
    w.store.add_request("suspend", NAMES[1:2], [], w.clock.now())
    w.settle()
    w.slurm.update_nodes(NAMES[1:2], state="power_down_force")  # Slurm's suspend, done
    assert w.rec(NAMES[1]).state == NodeState.TERMINATED
    w.daemon.reconciler.pass_once()
    assert held(w) == [] and not w.cloud.live()
    w.daemon.reconciler.pass_once()
    assert len(w.slurm.deleted) == 2  # nothing asked twice


def test_a_node_slurm_refuses_to_delete_is_asked_again_and_other_groups_go_on(w: World) -> None:
    w.daemon.reconciler.pass_once()
    with_limit(w, 2)
    n = w.slurm.node(NAMES[2])
    w.slurm._nodes[NAMES[2]] = n._replace(flags=n.flags | {"RESERVED"})  # in a reservation
    report = w.daemon.reconciler.pass_once()
    assert held(w) == NAMES[:3] and not w.slurm.deleted  # ours to know: not even asked
    assert not report.errors
    w.slurm._nodes[NAMES[2]] = n  # the reservation ended
    w.daemon.reconciler.pass_once()
    assert held(w) == NAMES[:2]


def test_a_protected_group_creates_nothing_until_enabled(w: World) -> None:
    w.daemon.reconciler.groups.protect("dyn", "three launches failed", w.clock.now())
    assert not w.slurm.updates or all(u["nodes"] for u in w.slurm.updates)  # nothing named
    w.daemon.reconciler.pass_once()
    assert held(w) == []
    w.daemon.reconciler.groups.enable("dyn")
    w.daemon.reconciler.pass_once()
    assert held(w) == NAMES[:3]


def test_nodes_of_a_group_no_longer_dynamic_are_deleted_when_free(w: World) -> None:
    w.slurm.create_nodes(["old-1", "old-2"], [("State", "CLOUD"), ("Features", "sbdyn_gone")])
    w.slurm.create_nodes(["theirs-1"], [("State", "CLOUD"), ("Features", "gpu")])
    n = w.slurm.node("old-2")
    w.slurm._nodes["old-2"] = n._replace(state="allocated")
    w.daemon.reconciler.pass_once()
    names = {n.name for n in w.slurm.nodes()}
    assert "old-1" not in names and {"old-2", "theirs-1"} <= names  # busy, and not ours


def test_an_instance_whose_dynamic_node_was_deleted_by_hand_is_torn_down(w: World) -> None:
    w.daemon.reconciler.pass_once()
    w.slurm.update_nodes(NAMES[:1], state="power_up")
    w.store.add_request("resume", NAMES[:1], [], w.clock.now())
    w.settle()
    w.slurm.slurmd_registered(NAMES[:1])
    del w.slurm._nodes[NAMES[0]]  # scontrol delete takes an idle node that is up
    w.daemon.reconciler.pass_once()  # the first sight: a read may race a create
    assert w.rec(NAMES[0]).state == NodeState.JOINED
    w.clock.advance(5)
    w.daemon.reconciler.pass_once()
    w.settle()
    assert w.rec(NAMES[0]).state == NodeState.TERMINATED and not w.cloud.live()
    events = [e for e in w.store.events() if e["event"] == "reconcile.teardown"]
    assert events and events[0]["detail"].startswith("SlurmNodeGone")


# -- the pure plan ---------------------------------------------------------------------


def _node(name: str, state: str = "idle", *flags: str) -> SlurmNode:
    return SlurmNode(name, state, frozenset({"CLOUD", "POWERED_DOWN", *flags}))


@pytest.mark.parametrize(
    ("node", "record", "ok"),
    [
        (_node("a"), None, True),
        (_node("a"), NodeState.TERMINATED, True),
        (_node("a"), NodeState.JOINED, False),  # an instance of ours
        (_node("a", "allocated"), None, False),
        (_node("a", "idle", "RESERVED"), None, False),
        (_node("a", "idle", "POWERING_UP"), None, False),
        (_node("a", "idle", "COMPLETING"), None, False),
        (SlurmNode("a", "idle", frozenset({"CLOUD"})), None, False),  # powered up
        (_node("a", "down"), None, False),
    ],
)
def test_deletable(node: SlurmNode, record: NodeState | None, ok: bool) -> None:
    assert deletable(node, record) is ok


def test_plan_dynamic() -> None:
    names = [f"d{i}" for i in range(1, 6)]
    slurm = {n: _node(n) for n in ("d2", "d4", "d5")}
    states = {"d5": NodeState.BOOTING}
    assert plan_dynamic(names, 3, states, slurm) == DynamicPlan(
        create=("d1", "d3"), delete=("d4",), waiting=("d5",)
    )
    assert plan_dynamic(names, 3, states, slurm, create=False).create == ()
    assert plan_dynamic(names, 5, {}, slurm).delete == ()


def test_strays_are_only_nodes_with_a_dynamic_feature_no_group_has() -> None:
    nodes = [
        _node("a")._replace(features=("sbdyn_dyn",)),
        _node("b")._replace(features=("cloud", "sbdyn_old")),
        _node("c")._replace(features=("sbdynamic",)),
    ]
    assert [n.name for n in strays(nodes, ["sbdyn_dyn"], "sbdyn_")] == ["b"]


# -- the config and its rendering ------------------------------------------------------


def test_render_names_the_group_by_its_nodeset_and_makes_room(tmp_path: Path) -> None:
    cfg = lab_config_in(tmp_path, DYN, [ROOM])
    files = render(cfg, "24.11")
    frag = files["slurm-burst.conf"]
    check_rendered("slurm-burst.conf", frag)
    assert "NodeSet=sbdyn_dyn Feature=sbdyn_dyn" in frag
    assert "MaxNodeCount=200" in frag
    assert "NodeName=burst-dyn" not in frag
    part = next(ln for ln in frag.splitlines() if ln.startswith("PartitionName=burst-dyn "))
    assert " Nodes=sbdyn_dyn " in part
    with pytest.raises(RenderError, match=r"23\.11"):
        render(cfg, "22.05")


@pytest.mark.parametrize(
    ("edits", "extra", "key", "words"),
    [
        ([], DYN, "slurm.max_node_count", "must be set with a dynamic node group"),
        ([("[slurm]\n", "[slurm]\nmax_node_count = 10\n")], DYN, "slurm.max_node_count",
         "below the node groups' own"),
        ([("[slurm]\n", '[slurm]\nmax_node_count = 200\nrelease = "22.05"\n')], DYN,
         "node_groups.dyn.nodes", "supports and tests them from Slurm"),
        ([ROOM], DYN.replace('"dynamic"', '"elastic"'), "node_groups.dyn.nodes",
         "'declared' or 'dynamic'"),
        ([ROOM], DYN + '[node_groups.dyn.warm.day]\nnodes = 1\nstart = "08:00"\nend = "18:00"\n',
         "node_groups.dyn.warm", "no warm pool"),
    ],
)  # fmt: skip
def test_config_check_says_what_a_dynamic_group_needs(
    tmp_path: Path, edits: list[tuple[str, str]], extra: str, key: str, words: str
) -> None:
    good = lab_config_in(tmp_path, DYN, [ROOM])
    assert not [p for p in validate(good) if p.severity == "error"]
    text = LAB_CONFIG.read_text().replace("/var/lib/slurm-burst-lab", f"{tmp_path}/lab")
    for old, new in edits:
        text = text.replace(old, new, 1)
    path = tmp_path / "case.toml"
    path.write_text(text + extra)
    path.chmod(0o640)
    _cfg, problems = check_config(path)
    assert any(p.path == key and words in p.message for p in problems), problems


def test_each_dynamic_group_refused_on_an_old_release_is_named_in_its_own_problem(
    tmp_path: Path,
) -> None:
    other = DYN.split("[partitions.")[0].replace("[node_groups.dyn]", "[node_groups.dyb]")
    text = LAB_CONFIG.read_text().replace("/var/lib/slurm-burst-lab", f"{tmp_path}/lab")
    text = text.replace("[slurm]\n", '[slurm]\nmax_node_count = 200\nrelease = "22.05"\n', 1)
    path = tmp_path / "case.toml"
    path.write_text(text + DYN + other.replace("burst-dyn-{n}", "burst-dyb-{n}"))
    path.chmod(0o640)
    _cfg, problems = check_config(path)
    said = {p.path: p.message for p in problems if p.path.endswith(".nodes")}
    assert said.keys() == {"node_groups.dyn.nodes", "node_groups.dyb.nodes"}, said
    for group in ("dyn", "dyb"):
        assert said[f"node_groups.{group}.nodes"].startswith(f"node group {group} is dynamic")


def test_the_cli_asks_scontrol_create_and_delete_with_one_argv_element_each() -> None:
    from slurm_burst.adapters.proc import Result
    from slurm_burst.adapters.slurm.cli import SlurmCli
    from slurm_burst.core.slurmsyntax import SlurmSyntaxError

    asked: list[list[str]] = []

    def runner(argv: list[str], timeout: float, env: object) -> Result:
        asked.append(argv[1:])
        return Result(tuple(argv), 0, "", "", 0.0)

    cli = SlurmCli(runner=runner, batch=2)
    cli.create_nodes(NAMES[:3], [("State", "CLOUD"), ("CPUs", 2), ("Features", "a,sbdyn_x")])
    cli.delete_nodes(NAMES[:3])
    assert asked == [
        ["create", "NodeName=burst-dyn-[1-3]", "State=CLOUD", "CPUs=2", "Features=a,sbdyn_x"],
        ["delete", "NodeName=burst-dyn-[1-2]"],
        ["delete", "NodeName=burst-dyn-3"],
    ]
    for names, settings in (
        (["a b"], [("State", "CLOUD")]),
        (["n[1-2]"], [("State", "CLOUD")]),
        ([], [("State", "CLOUD")]),
        (["n1"], [("Features", "x State=FUTURE")]),
        (["n1"], [("Features", "x#y")]),
    ):
        with pytest.raises((ValueError, SlurmSyntaxError)):
            cli.create_nodes(names, settings)
    with pytest.raises(ValueError):
        cli.delete_nodes(["n1,n2"])
    assert len(asked) == 3  # nothing hostile reached scontrol


def test_group_list_says_which_groups_are_dynamic(tmp_path: Path) -> None:
    import json

    from tests.conftest import invoke

    cfg = lab_config_in(tmp_path, DYN, [ROOM])
    state = Path(cfg.daemon.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    from slurm_burst.adapters.state.store import Store

    Store(state / "state.db")  # as the daemon makes it
    rows = {r["group"]: r for r in json.loads(
        invoke(["--config", cfg.source, "group", "list", "--json"]).stdout)}  # fmt: skip
    assert (rows["dyn"]["slurm_nodes"], rows["dyn"]["max_nodes"]) == ("dynamic", 3)
    assert rows["cpu"]["slurm_nodes"] == "declared"
    shown = invoke(["--config", cfg.source, "group", "list"]).stdout
    assert "burst-dyn-[1-6] (dynamic, 3 made)" in shown
