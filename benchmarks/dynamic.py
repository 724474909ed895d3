"""Dynamic node groups (issue 55): ``scontrol create`` and ``scontrol delete`` of 1,000
nodes against each newer release's real slurmctld (its image: lab.versioned, ports of
its own), through the Scheduler port the daemon uses; and the resume hook's p99 with a
1,000-node dynamic group in the config (goal < 300 ms, as without).

``python benchmarks/dynamic.py [--json] [--nodes N]`` (root: chroot, mounts). Per release:

- ``create_all_s``: one ``scontrol create NodeName=<1,000>`` (what a reconcile pass asks
  when the whole group is missing), and slurmctld's CPU seconds for it;
- ``delete_all_s``: the same nodes deleted as the daemon asks (batches of 100);
- ``create_each_ms`` / ``delete_each_ms``: one call per node for the first ``--each``
  (100) of them (what a group growing one node at a time costs), per node;
- for each phase the CPU seconds of slurmctld, of slurmdbd and of the host's MariaDB
  (/proc/PID/stat): each create and delete makes slurmctld send the cluster's TRES to
  slurmdbd, which writes them to the database;
- ``ctld_rss_mb``: slurmctld's resident memory holding the 1,000 nodes.

Each scontrol is a new process in the image's root (as on a controller).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import sizes  # noqa: E402

from slurm_burst.adapters.slurm.cli import SlurmCli  # noqa: E402
from slurm_burst.config import load_config  # noqa: E402
from slurm_burst.services.slurmconf import node_settings  # noqa: E402

LAB_CONFIG = ROOT / "slurm-conf" / "lab" / "slurm-burst.toml"
RELEASES = ("24.11", "26.05")


def group_toml(nodes: int) -> str:
    """A dynamic group of ``nodes`` names, all made (max_nodes = count)."""
    from slurm_burst_lab.slurmfeatures import group_toml as lab_group

    return "\n" + lab_group(count=nodes, max_nodes=nodes, pattern="dyn-{n:04d}")


def config_with_group(tmp: Path, nodes: int) -> Path:
    text = LAB_CONFIG.read_text().replace(
        "[slurm]\n", f"[slurm]\nmax_node_count = {nodes + 1000}\n", 1
    )
    path = tmp / "slurm-burst.toml"
    path.write_text(text + group_toml(nodes))
    path.chmod(0o640)
    return path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def mariadb_pid() -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in ("mariadbd", "mysqld"):
                    return int(entry.name)
            except OSError:
                continue
    return None


def one_release(release: str, cfg_path: Path, nodes: int, each: int, work: Path) -> dict[str, Any]:
    from slurm_burst_lab import images
    from slurm_burst_lab.versioned import VersionedController

    cfg = load_config(cfg_path)
    g = cfg.node_groups["dyn"]
    names = g.node_names()
    ctl = VersionedController(images.ensure(release), release, work, cfg)
    ctl.start()
    try:
        # chroot execs each daemon: the same processes
        ctld = ctl.procs[-1].pid
        pids = {"ctld": ctld, "dbd": ctl.procs[1].pid, "db": mariadb_pid()}
        cli = SlurmCli(timeout=300, runner=lambda argv, **kw: ctl.run(argv, **kw))
        settings = node_settings(g)
        out: dict[str, Any] = {"release": release, "nodes": nodes, "each": each}

        def timed(phase: str, fn: Any) -> None:
            c0 = {k: cpu_seconds(p) for k, p in pids.items() if p}
            t0 = time.perf_counter()
            fn()
            out[f"{phase}_s"] = time.perf_counter() - t0
            for k, p in pids.items():
                if p:
                    out[f"{phase}_{k}_cpu_s"] = cpu_seconds(p) - c0[k]

        timed("create_all", lambda: cli.create_nodes(names, settings))
        held = {n.name for n in cli.nodes()}
        assert set(names) <= held, "not every node was made"
        out["ctld_rss_mb"] = rss_mb(ctld)
        timed("delete_all", lambda: cli.delete_nodes(names))
        assert not set(names) & {n.name for n in cli.nodes()}, "a node was left"
        some = names[:each]

        def one_by_one(call: Any) -> None:
            for n in some:
                call([n])

        timed("create_each", lambda: one_by_one(lambda n: cli.create_nodes(n, settings)))
        timed("delete_each", lambda: one_by_one(cli.delete_nodes))
        for phase in ("create_each", "delete_each"):
            out[f"{phase}_ms"] = out.pop(f"{phase}_s") / each * 1e3
        out["ctld_errors"] = len(ctl.errors())
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
    finally:
        ctl.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=sizes.size(1000, 50))
    parser.add_argument("--each", type=int, default=sizes.size(100, 10))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the controllers stopped
    if os.geteuid() != 0:
        print(json.dumps({"not_measured": ["dynamic (needs root)"]}) if args.json else
              "dynamic nodes: skipped (needs root)")  # fmt: skip
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="sb-bench-dynamic-") as tmp:
        cfg = config_with_group(Path(tmp), args.nodes)
        for release in RELEASES:
            results.append(one_release(release, cfg, args.nodes, args.each, Path(tmp) / release))
    import burst

    calls = sizes.size(1000, 20)
    burst.bench_hooks(calls=calls)  # the same machine without the group: "unchanged"
    burst.bench_hooks(calls=calls, dynamic_nodes=args.nodes)
    if args.json:
        print(json.dumps(results))
        return
    for r in results:
        print(
            f"Slurm {r['release']}: {r['nodes']} dynamic nodes in one scontrol create "
            f"{r['create_all_s']:.2f} s, deleted (batches of 100) {r['delete_all_s']:.2f} s; "
            f"CPU s slurmctld/slurmdbd/MariaDB {cpu(r, 'create_all')} and "
            f"{cpu(r, 'delete_all')}; one call per node ({r['each']} nodes): create "
            f"{r['create_each_ms']:.0f} ms/node (CPU {cpu(r, 'create_each', r['each'])} "
            f"ms/node), delete {r['delete_each_ms']:.0f} ms/node (CPU "
            f"{cpu(r, 'delete_each', r['each'])} ms/node); slurmctld RSS "
            f"{r['ctld_rss_mb']:.0f} MB; error lines {r['ctld_errors']}"
        )


def cpu(r: dict[str, Any], phase: str, per: int = 0) -> str:
    """slurmctld/slurmdbd/MariaDB CPU of a phase: seconds, or ms per node (``per``)."""
    said = [r.get(f"{phase}_{k}_cpu_s") for k in ("ctld", "dbd", "db")]
    return "/".join("-" if v is None else f"{v / per * 1e3:.1f}" if per else f"{v:.2f}"
                    for v in said)  # fmt: skip


if __name__ == "__main__":
    main()
