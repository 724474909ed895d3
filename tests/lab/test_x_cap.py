"""A node group's cap in the lab: group ``capped`` names four nodes and allows two
instances at once (``max_nodes = 2``). Three one-node jobs: two run on cloud nodes, the
third waits in Slurm's queue with a reason (the nodes past the room drained with
``(Code:GroupAtCap)``) and runs when one of the first two ends; a node powered up by
hand meanwhile is refused by the daemon and gets no instance. The cloud's listing,
sampled throughout, never holds more than two of the group's instances."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.proc import run
from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.cap import MARK
from slurm_burst.core.hostlist import expand
from tests.conftest import wait
from tests.lab.conftest import job_fields

GROUP, PARTITION, PREFIX = "capped", "burst-cap", "burst-cap-"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


class Sampler:
    """The group's instances that are not terminated, in the cloud's own listing, four
    times a second on a thread of its own."""

    def __init__(self, cloud: Any) -> None:
        self.cloud = cloud
        self.counts: list[int] = []
        self.most: tuple[int, list[str]] = (0, [])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            live = sorted(n.name for n in self.cloud.list_nodes()
                          if n.name.startswith(PREFIX) and n.state != "terminated")  # fmt: skip
            self.counts.append(len(live))
            if len(live) > self.most[0]:
                self.most = (len(live), live)
            self._stop.wait(0.25)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def capped_nodes(env: dict[str, str]) -> set[str]:
    """The partition's nodes Slurm shows drained with the cap's reason (``sinfo -R``)."""
    out = run(["sinfo", "-h", "-R", "-p", PARTITION, "-o", "%N|%E"], env=env).stdout
    return {n for line in out.splitlines() if MARK in line
            for n in expand(line.split("|", 1)[0])}  # fmt: skip


def last_event(store: Store) -> int:
    """The id of the state database's newest event (its events are read in pages)."""
    since = 0
    while batch := store.events(since, 1000):
        since = batch[-1]["id"]
    return since


def submit(env: dict[str, str], shared: str, seconds: int) -> int:
    out = run(["sbatch", "--parsable", "-p", PARTITION, "-N1", "--exclusive", "-t", "5",
               "-o", "/dev/null", "-D", shared, "--wrap", f"sleep {seconds}"],
              env=env).stdout  # fmt: skip
    return int(out.strip().split(";")[0])


@pytest.fixture
def quiet(lab: Lab, env: dict[str, str], lab_config: Config) -> Iterator[None]:
    """The group with no instance, its cap in place (the daemon's pass drained the two
    nodes past its room), before the test and after it."""
    g = lab_config.node_groups[GROUP]
    assert (g.count, g.limit) == (4, 2)

    def settled() -> bool:
        return len(capped_nodes(env)) == g.count - g.limit

    wait(settled, 60, "the cap's drain on two of the group's four nodes")
    yield
    run(["scancel", "-p", PARTITION], env=env)


def test_a_third_job_waits_for_the_cap_and_a_hand_made_resume_is_refused(
    lab: Lab, env: dict[str, str], cloud: Any, store: Store, quiet: None
) -> None:
    shared = lab.lab.shared_dir
    since = last_event(store)
    with Sampler(cloud) as sampler:
        jobs = [submit(env, shared, 25), submit(env, shared, 25), submit(env, shared, 5)]

        def two_running() -> dict[int, dict[str, str]]:
            info = {j: job_fields(env, j) for j in jobs}
            running = [j for j in jobs if info[j]["JobState"] == "RUNNING"]
            return info if len(running) == 2 else {}

        info = wait(two_running, 120, "two of the three jobs running")
        waiting = [j for j in jobs if info[j]["JobState"] == "PENDING"]
        assert len(waiting) == 1, info
        third = waiting[0]
        reason = info[third]["Reason"]
        assert reason == "Resources", info[third]  # Slurm's, the drained nodes say why
        up = {info[j]["NodeList"] for j in jobs if j != third}
        capped = capped_nodes(env)
        assert len(capped) == 2 and not capped & up, (capped, up)

        # an admin powers a drained node up by hand: past the cap, refused, no instance
        node = sorted(capped)[0]
        run(["scontrol", "update", f"nodename={node}", "state=power_up"], env=env)

        def refused() -> list[dict[str, Any]]:
            return [e for e in store.events(since) if e["event"] == "node.over_cap"
                    and e["node"] == node]  # fmt: skip

        events = wait(refused, 60, f"the daemon refusing {node}")
        assert "max_nodes=2" in events[0]["detail"], events

        def ended() -> dict[int, dict[str, str]]:
            now = {j: job_fields(env, j) for j in jobs}
            return now if all(now[j]["JobState"] in ENDED for j in jobs) else {}

        done = wait(ended, 240, "the three jobs")
    assert [done[j]["JobState"] for j in jobs] == ["COMPLETED"] * 3, done
    first_end = min(done[j]["EndTime"] for j in jobs if j != third)
    assert done[third]["StartTime"] >= first_end, done[third]  # it ran once one ended
    assert sampler.most[0] <= 2, sampler.most
    assert max(sampler.counts) == 2 and len(sampler.counts) > 40, sampler.counts
    rec = store.node(node)
    assert rec is not None and rec.error == "GroupAtCap" and not rec.instance_id, rec
