"""The soak: many burst cycles with one daemon running throughout, then nothing left
behind and nothing grown.

A cycle resumes two nodes for a two-node job (``srun``), runs it, and powers the nodes
down once it has ended (``scontrol update state=power_down``: Slurm runs SuspendProgram at
once, as a SuspendTime of zero would; 22.05 cannot change a partition's SuspendTime
while it runs). Every tenth cycle one of the two nodes fails its launch (AuthFailure):
its job ends (an interactive job is not requeued) and the other node is released with it. Four pairs
of nodes take turns, so a pair powers down while the next cycles run.

At the end: no instance, no cloud VM (namespace) and no hub peer left, no mesh address
leased, every ledger row closed; the daemon's open file descriptors and threads as
after cycle 10 (both sampled with nothing in flight; the ledger's pooled SQLite
connections, which grow up to the pool's bound when threads write at once, counted
apart and bounded), its resident memory grown by at most 50 KB a cycle (checked from
100 cycles on: over 12 the allocator's steps outweigh any trend; the figure is printed
either way).

``SOAK_CYCLES`` (default 12; ``make test`` runs 8 through ``make soak``, ``make soak`` and
``make test-full`` 200). Under 20 cycles a short form: a launch fails every CYCLES // 2
cycles, not every tenth, and the baseline is sampled after cycle CYCLES // 2, not 10. The
figures are printed at the end of the run and written to ``soak.json`` in the lab's log
directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.wiring.daemon import mesh_hub
from slurm_burst.wiring.ledger import ledger
from tests.conftest import wait
from tests.lab.conftest import SOAK, sh

CYCLES = int(os.environ.get("SOAK_CYCLES", "12"))
# a failed launch every FAIL_EVERY cycles; the baseline after cycle BASE (the long form:
# every tenth, and after cycle 10)
FAIL_EVERY = 10 if CYCLES >= 20 else max(2, CYCLES // 2)
BASE = min(10, FAIL_EVERY)
PAIRS = [(f"burst-cpu-{i}", f"burst-cpu-{i + 1}") for i in (1, 3, 5, 7)]
RSS_PER_CYCLE = 50 * 1024  # bytes
POOL = 5  # what SQLAlchemy's QueuePool keeps open at rest (pool_size; overflow is closed)


def sample(pid: int) -> dict[str, Any]:
    """The daemon's open descriptors, threads and resident memory (bytes)."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(status["Threads"]),
        "rss": int(status["VmRSS"].split()[0]) * 1024,
    }


def quiet_sample(
    pid: int, env: dict[str, str], store: Store, nodes: tuple[str, ...]
) -> dict[str, Any]:
    """:func:`sample`, once nothing is in flight: every node powered down and torn down,
    the daemon's workers idle (a sample mid-teardown counts its SSH sessions)."""
    wait(lambda: powered_down(env, nodes), 180, "every node powered down")
    wait(lambda: all(str(r.state) == "terminated" for r in store.nodes()), 60, "nodes gone")
    wait(lambda: (store.heartbeat() or {}).get("in_flight") == 0, 60, "the workers idle")
    time.sleep(2)  # the last sessions' threads end
    # the fewest descriptors over 5 s: a leak stays, a connection the daemon holds for a
    # moment (an HTTP keep-alive to the EC2 emulator, a metrics scrape) does not
    # the ledger's SQLite connections are pooled (SQLAlchemy's QueuePool keeps up to
    # POOL of them open once two threads wrote at once): counted apart, and bounded. The
    # descriptors and their targets are one reading (a count and targets read apart saw
    # a pooled connection open between them, and counted a descriptor as closed)
    samples = []
    for _ in range(5):
        one = sample(pid)
        one["fd_targets"] = fd_targets(pid)  # said when the counts differ
        one["fds"] = len(one["fd_targets"])
        one["ledger_connections"] = sum(t.endswith("/ledger.db") for t in one["fd_targets"])
        one["fds_but_the_pool"] = one["fds"] - sum(
            t.endswith(("/ledger.db", "/ledger.db-wal", "/ledger.db-shm"))
            for t in one["fd_targets"]
        )
        samples.append(one)
        time.sleep(1)
    return min(samples, key=lambda x: x["fds_but_the_pool"])


def fd_targets(pid: int) -> list[str]:
    out = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        with contextlib.suppress(OSError):  # closed meanwhile
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


def powered_down(env: dict[str, str], nodes: tuple[str, ...]) -> bool:
    out = sh(env, "sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T", check=False)
    states = dict(line.split() for line in out.splitlines() if line.strip())
    return all(states.get(n) == "idle~" for n in nodes)


def cloud_vms(state_dir: str) -> int:
    """Processes of the namespace cloud's VMs (each VM's namespaces are held by its
    processes; the on-prem VMs live elsewhere and stay)."""
    out = subprocess.run(
        ["pgrep", "-f", f"nscloud.vminit {state_dir}/vms/"], capture_output=True, text=True
    )
    return len(out.stdout.split())


def test_burst_cycles_leave_nothing_behind_and_grow_nothing(
    lab: Lab,
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
) -> None:
    pid = int(lab.status()["processes"]["daemon"]["pid"])
    every = tuple(n for pair in PAIRS for n in pair)
    wait(lambda: powered_down(env, every), 180, "the soak's nodes powered down")
    started = time.monotonic()
    baseline: dict[str, int] = {}
    failed_cycles = 0
    for cycle in range(1, CYCLES + 1):
        pair = PAIRS[cycle % len(PAIRS)]
        wait(partial(powered_down, env, pair), 120, f"{pair} powered down")
        fail = cycle % FAIL_EVERY == 0
        if fail:
            faults([{"call": "create_node", "node": pair[0], "times": 1,
                     "error": "AuthFailure"}])  # fmt: skip
        # srun: its job leaves CONFIGURING as soon as the nodes answer (a batch job waits
        # for Slurm's 30 s periodic check), and an interactive job is not requeued
        srun = subprocess.run(
            ["srun", "-p", "burst-cpu", "-N2", "-w", ",".join(pair), "-t", "5", "true"],
            env=env, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        if fail:

            def released(pair: tuple[str, ...] = pair) -> bool:
                a, b = store.node(pair[0]), store.node(pair[1])
                return (
                    a is not None and b is not None
                    and (str(a.state), a.error) == ("terminated", "AuthFailure")
                    and (str(b.state), b.error) == ("terminated", "JobFailed")
                )  # fmt: skip

            assert srun.returncode != 0, f"cycle {cycle}: srun succeeded on a failed node"
            wait(released, 60, f"cycle {cycle}: {pair[0]} failed, {pair[1]} released")
            faults([])
            failed_cycles += 1
        else:
            assert srun.returncode == 0, f"cycle {cycle}: {srun.stderr[-2000:]}"
            sh(env, "scontrol", "update", f"nodename={','.join(pair)}", "state=power_down")
        if cycle == BASE:
            baseline = quiet_sample(pid, env, store, every)
    end = quiet_sample(pid, env, store, every)
    minutes = (time.monotonic() - started) / 60
    live = [n.id for n in cloud.list_nodes() if n.state != "terminated"]
    peers = mesh_hub(lab_config).peers()
    figures = {
        "cycles": CYCLES,
        "failed_launch_cycles": failed_cycles,
        "minutes": round(minutes, 1),
        "instances_left": len(live),
        "cloud_vms_left": cloud_vms(lab_config.providers["lab"].options["state_dir"]),
        "hub_peers_left": len(peers),
        "addresses_leased": len(store.addresses()),
        "ledger_rows_open": len(ledger(lab_config).open_instances()),
        f"after_cycle_{BASE}": baseline,
        "at_end": end,
        "rss_growth_per_cycle_bytes": round((end["rss"] - baseline["rss"]) / max(1, CYCLES - BASE)),
    }
    SOAK.update(figures)
    (lab.paths.log / "soak.json").write_text(json.dumps(figures, indent=2) + "\n")
    assert (live, figures["cloud_vms_left"], peers) == ([], 0, []), figures
    assert figures["addresses_leased"] == 0 and figures["ledger_rows_open"] == 0, figures
    assert (end["fds_but_the_pool"], end["threads"]) == (
        baseline["fds_but_the_pool"], baseline["threads"]), figures  # fmt: skip
    assert end["ledger_connections"] <= POOL, figures
    if CYCLES >= 100:  # over fewer cycles the allocator's steps outweigh the trend
        assert end["rss"] - baseline["rss"] <= RSS_PER_CYCLE * (CYCLES - BASE), figures
    assert failed_cycles == CYCLES // FAIL_EVERY, figures
