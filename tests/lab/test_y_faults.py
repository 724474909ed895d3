"""The fault matrix (``pytest -m faults``): a fault injected into the running lab, and
the daemon must end, within two reconcile passes of the fault's effect, with

- no cloud instance lacking a live node (one instance per node at most),
- no hub peer without a live node,
- every affected job requeued, running or completed,
- the ledger consistent: no open ledger row for an instance that is gone.

Cloud faults go through the lab provider's fault file (``lab/slurm_burst_lab/faults.py``):
provider errors with real codes, instances that never boot, and packets really
dropped inside a VM (``ip rule ... blackhole``). Process faults are real: the
daemon SIGKILLed, hooks called twice or out of turn. Each case adds a row to the
matrix printed at the end of the run (fault -> outcome -> passes needed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab import images
from slurm_burst_lab.config import settings
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.nodestate import LIVE
from slurm_burst.wiring.daemon import mesh_hub
from slurm_burst.wiring.ledger import ledger
from tests.conftest import FULL, LAB_CONFIG, invoke
from tests.conftest import wait as until
from tests.lab.conftest import FAULT_MATRIX, await_alert, job_fields, sh

pytestmark = pytest.mark.faults

SB = ["--config", str(LAB_CONFIG)]


def sbatch(env: dict[str, str], node: str, seconds: int = 1) -> int:
    out = sh(
        env,
        "sbatch",
        "--parsable",
        "-p",
        "burst-cpu",
        "-w",
        node,
        "-t",
        "5",
        "-o",
        "/dev/null",
        "--wrap",
        f"sleep {seconds}; hostname",
    )
    return int(out.strip().split(";")[0])


def job_state(env: dict[str, str], job: int) -> str:
    return job_fields(env, job).get("JobState", "GONE")


def wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    return until(cond, timeout, what, every=0.5)


def passes(store: Store) -> int:
    last = store.last_pass() or {}
    return int(last.get("ended", 0) * 1000)


def events(store: Store, node: str, since: int) -> list[dict[str, Any]]:
    return [e for e in store.events(since, 100_000) if e["node"] == node]


def last_event_id(store: Store) -> int:
    evs = store.events(0, 1_000_000)
    return int(evs[-1]["id"]) if evs else 0


def check_invariants(
    store: Store, cloud: Any, lab_config: Config, jobs: list[int], env: dict[str, str]
) -> list[str]:
    """What is wrong now (empty: the world is consistent)."""
    wrong = []
    records = {r.name: r for r in store.nodes()}
    live = [n for n in cloud.list_nodes() if n.state != "terminated"]
    per_node: dict[str, int] = {}
    for n in live:
        node = n.extra.get("tags", {}).get("slurm-burst-node", n.name)
        per_node[node] = per_node.get(node, 0) + 1
        rec = records.get(node)
        if rec is None or rec.state not in LIVE or rec.instance_id != n.id:
            wrong.append(f"instance {n.id} of {node} has no live node")
    wrong += [f"{k} has {v} instances" for k, v in per_node.items() if v > 1]
    keys = {r.wg_pubkey for r in records.values() if r.wg_pubkey and r.state in LIVE}
    wrong += [
        f"stale hub peer {p.comment}"
        for p in mesh_hub(lab_config).peers()
        if p.public_key not in keys
    ]
    for j in jobs:
        st = job_state(env, j)
        if st not in ("PENDING", "RUNNING", "COMPLETED", "CONFIGURING", "COMPLETING", "GONE"):
            wrong.append(f"job {j} is {st}")
    alive = {n.id for n in live}
    open_rows = ledger(lab_config).open_instances()
    wrong += [f"ledger row of {i} ({node}) open" for i, node in open_rows.items() if i not in alive]
    return wrong


def settle(
    name: str,
    outcome: str,
    store: Store,
    cloud: Any,
    lab_config: Config,
    env: dict[str, str],
    jobs: list[int],
    done: Callable[[], bool] = lambda: True,
    timeout: float = 240,
) -> None:
    """Wait until ``done`` and the invariants hold; record the reconcile passes after which
    the invariants held (counted from the fault's effect) and the seconds until done."""
    start = store.last_pass() or {}
    first = float(start.get("ended", time.time()))
    t0 = time.monotonic()
    deadline = t0 + timeout
    wrong: list[str] = ["not checked"]
    consistent_at: float | None = None  # the pass after which the invariants first held
    while time.monotonic() < deadline:
        wrong = check_invariants(store, cloud, lab_config, jobs, env)
        if not wrong and consistent_at is None:
            consistent_at = float((store.last_pass() or {}).get("ended", first))
        if wrong:
            consistent_at = None  # not yet (or no longer): count again
        if not wrong and done():
            break
        time.sleep(1)
    else:
        FAULT_MATRIX.append((name, f"FAILED: {wrong}", "-", "-"))
        pytest.fail(f"{name}: not consistent after {timeout:g} s: {wrong}")
    assert consistent_at is not None
    n = max(0, round((consistent_at - first) / lab_config.daemon.poll_period))
    FAULT_MATRIX.append((name, outcome, str(n), f"{time.monotonic() - t0:.0f}"))


def completed(env: dict[str, str], job: int) -> Callable[[], bool]:
    return lambda: job_state(env, job) == "COMPLETED"


def requeued(env: dict[str, str], store: Store, job: int, node: str) -> Callable[[], bool]:
    """The job is back in the queue (Slurm delays a requeued job's start by its BeginTime)
    and the failed node is torn down."""

    def check() -> bool:
        rec = store.node(node)
        return (
            job_state(env, job) == "PENDING" and rec is not None and str(rec.state) == "terminated"
        )

    return check


@pytest.fixture
def cancel(env: dict[str, str]) -> Iterator[list[int]]:
    """Jobs to cancel after the case (a requeued job would start minutes later)."""
    jobs: list[int] = []
    yield jobs
    if jobs:
        subprocess.run(["scancel", *map(str, jobs)], env=env, timeout=30, check=False)


def node_failed_with(store: Store, node: str, since: int, code: str) -> bool:
    return any(
        e["event"] == "node.failed" and e["detail"] == code for e in events(store, node, since)
    )


def failed_and_named(
    env: dict[str, str], store: Store, node: str, since: int, code: str
) -> Callable[[], bool]:
    """For wait(): ``node`` failed with ``code`` and Slurm's reason named it (read at each
    call: the reason is cleared when the node powers down)."""
    reasons: list[str] = []

    def check() -> bool:
        reasons.append(sh(env, "sinfo", "-h", "-N", "-n", node, "-o", "%E").strip())
        named = any(f"(Code:{code})" in r for r in reasons)
        other = [e["detail"] for e in events(store, node, since)
                 if e["event"] == "node.failed" and e["detail"] != code]  # fmt: skip
        if other:
            pytest.fail(f"{node} failed with {other}, not {code}; reasons seen: {reasons[-3:]}")
        return named and node_failed_with(store, node, since, code)

    return check


# -- cloud API faults ------------------------------------------------------------------


def test_capacity_error_falls_back_to_the_next_size(
    lab_config: Config, env: dict[str, str], store: Store, cloud: Any, faults: Any
) -> None:
    faults([{"call": "create_node", "error": "InsufficientInstanceCapacity", "size": "ns.cpu2"}])
    job = sbatch(env, "burst-cpu-20")
    settle("capacity error", "ns.cpu2 cooling down; launched ns.cpu4", store, cloud, lab_config,
           env, [job], completed(env, job))  # fmt: skip
    assert ("lab", "ns.cpu2") in store.unavailable(time.time())
    inst = [i for i in ledger(lab_config).instances() if i["node"] == "burst-cpu-20"]
    assert inst[-1]["size"] == "ns.cpu4"


def test_throttling_is_retried_without_a_duplicate(
    lab_config: Config, env: dict[str, str], store: Store, cloud: Any, faults: Any
) -> None:
    faults(
        [
            {
                "call": "create_node",
                "error": "RequestLimitExceeded",
                "http": 503,
                "node": "burst-cpu-21",
                "times": 2,
            }
        ]
    )
    before = {n.id for n in cloud.list_nodes()}
    job = sbatch(env, "burst-cpu-21")
    settle("throttling (503 x2)", "retried with backoff; one instance", store, cloud,
           lab_config, env, [job], completed(env, job))  # fmt: skip
    # its job's instances: made before the job ended (one made later under the same name
    # is another job's, such as the burst policy's, once this job's node was released)
    ended = datetime.fromisoformat(job_fields(env, job)["EndTime"]).timestamp()
    made = [n for n in cloud.list_nodes() if n.id not in before and n.name == "burst-cpu-21"
            and float(n.extra.get("created_at") or 0) <= ended + 1]  # fmt: skip
    assert len(made) == 1, made


# Faults that fail the node: the failure is named in the node's reason, the job goes
# back to the queue, and nothing of the node is left (instance, peer, address, ledger).
# (fault, node, what to inject, failure code, seconds to wait for it)
NODE_FAILURES: list[tuple[str, str, dict[str, Any], str, float]] = [
    ("auth failure", "burst-cpu-22", {"error": "AuthFailure"}, "AuthFailure", 60),
    ("instance never boots", "burst-cpu-23", {"never_running": True}, "BootTimeout", 90),
    ("SSH never reachable", "burst-cpu-15", {"block": ["ipproto tcp sport 22"]},
     "SshUnreachable", 120),
    ("WireGuard handshake never completes", "burst-cpu-24",
     {"block": ["ipproto udp dport 51820"]}, "WireGuardHandshake", 120),
    # slurmd fetches its config from the hub address, then cannot reach SlurmctldAddr
    ("slurmd never registers", "burst-cpu-16",
     {"block": ["to {controller_addr} ipproto tcp dport 6817"]}, "SlurmdNotRegistered", 150),
]  # fmt: skip


def test_node_failures_are_named_and_their_jobs_requeued(
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
    cancel: list[int],
) -> None:
    """Each fault of NODE_FAILURES on a node of its own, all at once (each waits on a
    timer of the daemon's: side by side they take as long as the longest, not the sum).
    Every node fails with its own code, named in its Slurm reason, and its job is
    requeued. The lab's protect_after (6) is above their number: failures at once in one
    group protecting it is test_repeated_failures_protect_the_group's case."""
    ctl = lab_config.cluster.controller_addr
    rules = []
    for _, node, rule, _, _ in NODE_FAILURES:
        if "block" in rule:
            rule = {"block": [b.format(controller_addr=ctl) for b in rule["block"]]}
        rules.append({"call": "create_node", "node": node, "times": 1, **rule})
    faults(rules)
    since = last_event_id(store)
    t0 = time.monotonic()
    jobs = {node: sbatch(env, node) for _, node, _, _, _ in NODE_FAILURES}
    cancel.extend(jobs.values())
    waiting = {node: (failed_and_named(env, store, node, since, code), t0 + within, code)
               for _, node, _, code, within in NODE_FAILURES}  # fmt: skip
    requeue: dict[str, float] = {}  # failed: its job's requeue awaited, until
    while waiting or requeue:
        for node, (check, deadline, code) in list(waiting.items()):
            if check():
                del waiting[node]
                requeue[node] = time.monotonic() + 60
            elif time.monotonic() > deadline:
                pytest.fail(f"{node} did not fail with {code}, named in its Slurm reason, "
                            f"within {deadline - t0:.0f} s")  # fmt: skip
        for node, deadline in list(requeue.items()):
            # Restarts, not PENDING: a job requeued early may run again meanwhile
            if int(job_fields(env, jobs[node]).get("Restarts", "0") or 0) >= 1:
                del requeue[node]
            elif time.monotonic() > deadline:
                pytest.fail(f"job {jobs[node]} of {node} not requeued within 60 s of its failure")
        time.sleep(0.5)
    for fault, node, _, code, _ in NODE_FAILURES:
        settle(fault, f"node DOWN (Code:{code}); job requeued", store, cloud, lab_config, env,
               [jobs[node]])  # fmt: skip


# Bad GPUs (the simulated NVML of a new VM, lab/simnvml FAULTS): the node's GPU check
# keeps it out (GpuUnhealthy, the problem in its Slurm reason), Slurm requeues the job,
# and the job runs on a new instance of the node. (fault, node, the reason's words)
GPU_FAULTS = [
    ("xid-79", "burst-gpu-3", "gpu 1: XID 79 event"),
    ("ecc-uncorrectable", "burst-gpu-4", "gpu 0: 3 uncorrectable ECC errors"),
    ("row-remap-pending", "burst-gpu-5", "gpu 1: row remap pending"),
    ("gpu-missing", "burst-gpu-6", "1 GPU seen, 2 expected"),
    ("wrong-driver", "burst-gpu-7", "driver 535.104.05, the group pins 550.54.15"),
]


# make test runs one of them (XID 79, a GPU fallen off the bus); make test-full all five.
# Each fault's own reading is checked apart, against the simulated library
# (tests/integration/test_nvml_sim.py): here, what the daemon and Slurm do with a refusal.
GPU_FAULTS_RUN = GPU_FAULTS if FULL else [GPU_FAULTS[0]]


def test_bad_gpus_keep_their_nodes_out_and_the_jobs_run_on_new_instances(
    lab: Lab,
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
    cancel: list[int],
) -> None:
    """Nodes each born with one bad GPU (five in make test-full, one in make test). Each
    is refused with GpuUnhealthy, named in its Slurm reason, and its job runs on a
    healthy new instance. The jobs are released one after the other, the group enabled
    again after each refusal (as an admin would: failures in a row protect a group,
    test_repeated_failures_protect_the_group), and which of the jobs released together
    Slurm resumes in one pass depends on the machine's load. The requeued jobs (each
    waits cred_expire, 15 s in the lab) run meanwhile."""
    from slurm_burst_lab.simnvml import FAULTS

    invoke([*SB, "group", "enable", "gpu"], expect=None)  # whatever an earlier test left
    faults([{"call": "create_node", "node": node, "gpu": FAULTS[fault], "times": 1}
            for fault, node, _ in GPU_FAULTS_RUN])  # fmt: skip
    since = last_event_id(store)
    first = {node: (store.node(node).launch_seq if store.node(node) else 0)  # type: ignore[union-attr]
             for _, node, _ in GPU_FAULTS_RUN}  # fmt: skip
    jobs = {}
    for _, node, _ in GPU_FAULTS_RUN:  # held, then released one by one
        out = sh(env, "sbatch", "--parsable", "-H", "-p", "burst-gpu", "-w", node,
                 "--gres=gpu:1", "-t", "5", "-o", "/dev/null", "--wrap", "hostname")  # fmt: skip
        jobs[node] = int(out.strip().split(";")[0])
    cancel.extend(jobs.values())
    started = time.monotonic()
    for fault, node, words in GPU_FAULTS_RUN:
        sh(env, "scontrol", "release", str(jobs[node]))
        wait(failed_and_named(env, store, node, since, "GpuUnhealthy"), 90,
             f"{node} ({fault}) refused with GpuUnhealthy, named in its Slurm reason")  # fmt: skip
        said = [e["detail"] for e in events(store, node, since)
                if e["event"] == "node.gpu_unhealthy"]  # fmt: skip
        assert len(said) == 1 and words in said[0], said
        wait(lambda: invoke([*SB, "group", "enable", "gpu"], expect=None).exit_code == 0, 60,
             "group enable gpu")  # fmt: skip
    for fault, node, words in GPU_FAULTS_RUN:
        left = max(60.0, 240 - (time.monotonic() - started))
        settle(f"GPU: {fault}", f"node out (Code:GpuUnhealthy: {words[:28]}); job ran on a "
               "new instance", store, cloud, lab_config, env, [jobs[node]],
               completed(env, jobs[node]), timeout=left)  # fmt: skip
        rec = store.node(node)
        assert rec is not None and rec.launch_seq >= first[node] + 2  # the refused one, a new one
        # slurmdbd records the job after it ends: the first record it holds
        ran_on = until(partial(sh, env, "sacct", "-n", "-X", "-j", str(jobs[node]), "-o",
                               "NodeList"), 60, f"job {jobs[node]} in sacct", every=1)  # fmt: skip
        assert ran_on.split() == [node]


def test_a_node_whose_slurmd_release_slurmctld_cannot_take_is_refused(
    lab: Lab,
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
    cancel: list[int],
) -> None:
    """A real slurmd of the wrong release: on the host's 22.05, VMs that boot the newest
    release's image (slurmd newer than slurmctld); on another release, VMs that boot the
    host's filesystem (22.05's slurmd, too old for 24.11 and 26.05). The daemon asks
    first, refuses the node (SlurmdVersion) before it joins, and the job is requeued."""
    running = lab.running_release()
    node = "burst-cpu-14"
    if running == images.HOST_RELEASE:
        image: str | None = str(images.ensure(images.NEWEST))
        slurmd, why = images.NEWEST, "newer than slurmctld"
    else:
        image, slurmd, why = None, images.HOST_RELEASE, "too old"
    since = last_event_id(store)
    cloud.ex_set_host_image(image, (lab.lab.shared_dir,))
    try:
        job = sbatch(env, node)
        cancel.append(job)
        what = f"{node} (slurmd {slurmd}) refused for slurmctld {running}, named in its reason"
        wait(failed_and_named(env, store, node, since, "SlurmdVersion"), 90, what)
    finally:  # the lab's own image again for what follows
        root = lab.slurm_root().image()
        cloud.ex_set_host_image(str(root) if root else None, (lab.lab.shared_dir,))
    joined = [e for e in events(store, node, since) if e["event"] == "node.joined"]
    assert joined == [], "a refused node never joins"
    settle(f"slurmd {why} ({slurmd} on {running})", "node refused (Code:SlurmdVersion); "
           "job requeued", store, cloud, lab_config, env, [job],
           requeued(env, store, job, node))  # fmt: skip


# The runtime check (docs/runtime.md): the lab's reference (lab.runtime_reference, taken
# on the on-prem node at lab up) made to differ from group train's nodes beyond
# 'compatible', one field class at a time in make test-full, two at once in make test.
# Each field's reading is tested apart (tests/integration/test_runtime_cli.py, the driver
# through the simulated NVML in test_nvml_sim.py); here, what the daemon and Slurm do.
RUNTIME_FAULTS: list[tuple[str, dict[str, Any]]] = [
    ("os", {"os": "debian 11"}),
    ("kernel", {"kernel": "5.10.0-99-amd64"}),
    ("glibc", {"glibc": "2.99"}),
    ("driver", {"driver": "550.54.15", "cuda_driver": "12.4"}),
    ("mpi", {"mpi": "openmpi 9.9.9"}),
    ("python", {"python": "3.99.0"}),
    ("library", {"libraries": {"libmpi.so.40": "libmpi.so.40.99.9 " + "0" * 64}}),
    ("package", {"packages": {"numpy": "0.0.1", "mpi4py": "0.0.1"}}),
]
RUNTIME_FAULTS_RUN = (
    RUNTIME_FAULTS if FULL
    else [("kernel+package", {**RUNTIME_FAULTS[1][1], **RUNTIME_FAULTS[7][1]})]
)  # fmt: skip


@pytest.mark.parametrize(
    ("what", "changes"), RUNTIME_FAULTS_RUN, ids=[w for w, _ in RUNTIME_FAULTS_RUN]
)
def test_a_node_whose_runtime_differs_from_on_prem_is_refused_before_slurmd(
    lab: Lab,
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    cancel: list[int],
    what: str,
    changes: dict[str, Any],
) -> None:
    """The node is refused (RuntimeMismatch, each differing field in the event and the
    reason) before anything of the site reaches it: it never joins, no job runs there,
    and the job is requeued."""
    node = "burst-train-4"
    reference = Path(lab.lab.runtime_reference)
    kept = reference.read_bytes()
    invoke([*SB, "group", "enable", "train"], expect=None)  # whatever an earlier case left
    since = last_event_id(store)
    reference.write_text(json.dumps({**json.loads(kept), **changes}))
    try:
        out = sh(env, "sbatch", "--parsable", "-p", "burst-train", "-w", node, "-t", "5",
                 "-o", "/dev/null", "--wrap", "hostname")  # fmt: skip
        job = int(out.strip().split(";")[0])
        cancel.append(job)
        wait(failed_and_named(env, store, node, since, "RuntimeMismatch"), 90,
             f"{node} refused with RuntimeMismatch ({what}), named in its reason")  # fmt: skip
    finally:
        reference.write_bytes(kept)
    [said] = [e["detail"] for e in events(store, node, since)
              if e["event"] == "node.runtime_mismatch"]  # fmt: skip
    for field in changes:
        name = {"libraries": "library:libmpi.so.40", "packages": "package:numpy"}.get(field, field)
        assert f"{name}: " in said, (field, said)
    assert [e for e in events(store, node, since) if e["event"] == "node.joined"] == []
    settle(f"runtime: {what} differs from on-prem", "node refused before slurmd "
           "(Code:RuntimeMismatch); job requeued", store, cloud, lab_config, env, [job],
           requeued(env, store, job, node))  # fmt: skip
    steps = sh(env, "sacct", "-n", "-P", "-j", str(job), "-o", "JobID").split()
    assert not [st for st in steps if ".batch" in st], steps  # its script never started


def test_a_two_node_job_whose_node_never_boots_releases_the_other_at_once(
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
    cancel: list[int],
) -> None:
    """All or nothing per job: burst-cpu-12 never boots, so the job is requeued (its node
    DOWN first) and burst-cpu-13, booted for nothing, is torn down and returned to Slurm
    then, not left to join and idle until SuspendTime."""
    bad, other = "burst-cpu-12", "burst-cpu-13"
    faults([{"call": "create_node", "node": bad, "times": 1, "never_running": True}])
    since = last_event_id(store)
    out = sh(env, "sbatch", "--parsable", "-p", "burst-cpu", "-N2", "-w", f"{bad},{other}",
             "-t", "5", "-o", "/dev/null", "--wrap", "srun hostname")  # fmt: skip
    job = int(out.strip().split(";")[0])
    cancel.append(job)

    def released() -> bool:
        rec = store.node(other)
        return (
            any(e["event"] == "node.released" for e in events(store, other, since))
            and rec is not None
            and (str(rec.state), rec.error) == ("terminated", "JobFailed")
        )

    wait(lambda: node_failed_with(store, bad, since, "BootTimeout"), 90, f"{bad} to time out")
    wait(released, 30, f"{other} released with the job")
    detail = next(e["detail"] for e in events(store, other, since) if e["event"] == "node.released")
    assert detail == f"job {job} lost {bad} (BootTimeout)"
    settle("a 2-node job loses a node", "job requeued; its other node released at once",
           store, cloud, lab_config, env, [job], requeued(env, store, job, bad))  # fmt: skip
    assert not [i for i in cloud.list_nodes() if i.name == other and i.state != "terminated"]


# -- the world changes under the daemon ------------------------------------------------


def test_instance_deleted_under_a_running_job(
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
    cancel: list[int],
) -> None:
    since = last_event_id(store)
    job = sbatch(env, "burst-cpu-25", seconds=20)
    cancel.append(job)
    wait(lambda: job_state(env, job) == "RUNNING", 120, "the job to run")
    rec = store.node("burst-cpu-25")
    assert rec is not None and rec.instance_id
    node = next(n for n in cloud.list_nodes() if n.id == rec.instance_id)
    cloud.destroy_node(node)  # a spot reclaim, or an operator in the console
    wait(
        lambda: node_failed_with(store, "burst-cpu-25", since, "InstanceVanished"),
        30,
        "InstanceVanished",
    )
    settle("instance deleted (spot reclaim)", "InstanceVanished; node DOWN; job requeued",
           store, cloud, lab_config, env, [job],
           requeued(env, store, job, "burst-cpu-25"))  # fmt: skip


def test_orphan_instance_is_terminated_after_the_grace_period(
    lab_config: Config, env: dict[str, str], store: Store, cloud: Any, faults: Any
) -> None:
    from libcloud.compute.base import NodeAuthSSHKey, NodeImage

    size = next(s for s in cloud.list_sizes() if s.id == "ns.cpu2")
    orphan = cloud.create_node(
        name="burst-cpu-31",
        size=size,
        image=NodeImage(id="host", name="host", driver=cloud),
        auth=NodeAuthSSHKey(
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOrphanOrphanOrphanOrphanOrphan x"
        ),
        ex_metadata={
            "slurm-burst-cluster": lab_config.cluster.name,
            "slurm-burst-node": "burst-cpu-31",
        },
    )

    def gone() -> bool:
        return all(n.state == "terminated" for n in cloud.list_nodes() if n.id == orphan.id)

    # the shipped alert fires while the orphan lives (lab: orphan_grace 10 s, 'for:' 2 s)
    await_alert(lab_config, "SlurmBurstOrphanInstances", True, timeout=30, provider="lab")
    settle("orphan instance", "terminated after orphan_grace", store, cloud, lab_config, env,
           [], gone)  # fmt: skip
    await_alert(lab_config, "SlurmBurstOrphanInstances", False, provider="lab")


# -- process faults ----------------------------------------------------------------------


@pytest.mark.parametrize("state", ["launching", "booting", "bootstrapping", "joined"])
def test_daemon_sigkilled_in_each_state(
    state: str,
    lab: Lab,
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
) -> None:
    node = {
        "launching": "burst-cpu-26",
        "booting": "burst-cpu-27",
        "bootstrapping": "burst-cpu-28",
        "joined": "burst-cpu-19",
    }[state]
    if state == "launching":  # hold the call open after the instance exists
        faults([{"call": "create_node", "delay_after": 8, "node": node, "times": 1}])
    before = {n.id for n in cloud.list_nodes()}
    job = sbatch(env, node, seconds=3)

    def reached() -> bool:
        rec = store.node(node)
        return rec is not None and str(rec.state) == state and rec.want == "up"

    wait(reached, 120, f"{node} in state {state}")
    lab.restart("daemon", signal.SIGKILL)
    settle(f"daemon SIGKILLed while {state}", "restarted; resumed from the database; one instance",
           store, cloud, lab_config, env, [job], completed(env, job))  # fmt: skip
    made = [n for n in cloud.list_nodes() if n.id not in before and n.name == node]
    assert len(made) == 1, [(n.id, n.state) for n in made]


def test_duplicate_resume_makes_no_second_instance(
    lab_config: Config, env: dict[str, str], store: Store, cloud: Any, faults: Any
) -> None:
    before = {n.id for n in cloud.list_nodes()}
    job = sbatch(env, "burst-cpu-29")
    wait(lambda: (r := store.node("burst-cpu-29")) is not None and r.want == "up", 60, "resume")
    invoke([*SB, "resume", "burst-cpu-29"])  # Slurm (or an admin) asks again
    invoke([*SB, "resume", "burst-cpu-29"])
    settle("duplicate resume", "no-op; one instance", store, cloud, lab_config, env, [job],
           completed(env, job))  # fmt: skip
    made = [n for n in cloud.list_nodes() if n.id not in before and n.name == "burst-cpu-29"]
    assert len(made) == 1


def test_suspend_during_bootstrap(
    lab_config: Config, env: dict[str, str], store: Store, cloud: Any, faults: Any
) -> None:
    job = sbatch(env, "burst-cpu-30")

    def bootstrapping() -> bool:
        rec = store.node("burst-cpu-30")
        return rec is not None and str(rec.state) in ("booting", "bootstrapping")

    wait(bootstrapping, 120, "burst-cpu-30 booting")
    invoke([*SB, "suspend", "burst-cpu-30"])
    wait(lambda: str(getattr(store.node("burst-cpu-30"), "state", "")) == "terminated", 60,
         "the suspended node torn down")  # fmt: skip
    settle("suspend during bootstrap", "torn down; Slurm's resume redone; job ran", store, cloud,
           lab_config, env, [job], completed(env, job))  # fmt: skip


def _mid_resume(store: Store, node: str) -> Callable[[], bool]:
    def check() -> bool:
        rec = store.node(node)
        state = str(getattr(rec, "state", ""))
        return rec is not None and rec.want == "up" and state in ("booting", "bootstrapping")

    return check


def test_slurmctld_restarted_mid_resume(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store, cloud: Any, faults: Any
) -> None:
    before = {n.id for n in cloud.list_nodes()}
    job = sbatch(env, "burst-cpu-17")
    wait(_mid_resume(store, "burst-cpu-17"), 120, "burst-cpu-17 booting")
    lab.restart("slurmctld")  # SIGTERM: slurmctld saves its state and reads it back
    settle("slurmctld restarted mid-resume", "node joined after the restart; job ran", store,
           cloud, lab_config, env, [job], completed(env, job))  # fmt: skip
    made = [n for n in cloud.list_nodes() if n.id not in before and n.name == "burst-cpu-17"]
    assert len(made) == 1, [(n.id, n.state) for n in made]


def _restart_mariadb(logdir: Path) -> None:
    """Restart the local MariaDB (slurmdbd's accounting database) as it was started."""
    from slurm_burst_lab import components as c

    sh({}, "mariadb-admin", "-uroot", "shutdown")  # waits until the server is down
    c.spawn(["/usr/sbin/mariadbd", "--user=mysql"], logdir / "mariadbd.out")
    wait(lambda: subprocess.run(["mariadb", "-uroot", "-e", "SELECT 1"], capture_output=True,
                                check=False, timeout=10).returncode == 0,
         60, "MariaDB back")  # fmt: skip


def test_database_restarted_mid_burst(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store, cloud: Any, faults: Any
) -> None:
    from datetime import UTC, datetime, timedelta

    job = sbatch(env, "burst-cpu-18", seconds=5)
    wait(_mid_resume(store, "burst-cpu-18"), 120, "burst-cpu-18 booting")
    _restart_mariadb(lab.paths.log)
    settle("database (MariaDB) restarted mid-burst", "job ran; its accounting reached the ledger",
           store, cloud, lab_config, env, [job], completed(env, job))  # fmt: skip
    led = ledger(lab_config)
    now = datetime.now(UTC)

    def in_ledger() -> bool:
        invoke([*SB, "ledger", "sync"], expect=None)
        return any(j.job_id == job for j in led.jobs_between(now - timedelta(hours=1), now
                                                               + timedelta(hours=1)))  # fmt: skip

    wait(in_ledger, 120, f"job {job} in the ledger (slurmdbd reconnected to MariaDB)")


def test_repeated_failures_protect_the_group(
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
    cancel: list[int],
) -> None:
    faults([{"call": "create_node", "error": "AuthFailure"}])  # every launch fails
    times = lab_config.daemon.protect_after
    nodes = (11, 12, 13, 15, 16, 22, 23, 24)[:times]  # not 14: its drain is read below
    assert len(nodes) == times, f"the lab's protect_after {times} needs more nodes here"
    jobs = [sbatch(env, f"burst-cpu-{n}") for n in nodes]
    cancel.extend(jobs)

    def protected() -> bool:
        st = json.loads(invoke([*SB, "status", "--json"], expect=None).stdout)
        return "cpu" in st["protected_groups"]

    wait(protected, 120, "the cpu group protected")
    out = sh(env, "scontrol", "show", "node", "burst-cpu-14")
    assert "Code:GroupProtected" in out and "DRAIN" in out
    # the shipped alert, through the lab's Prometheus (its 'for:' cut to 2 s)
    await_alert(lab_config, "SlurmBurstGroupProtected", True, group="cpu")
    Path(settings(lab_config).fault_file).unlink()
    wait(lambda: invoke([*SB, "group", "enable", "cpu"], expect=None).exit_code == 0, 120,
         "group enable (slurmctld may be busy requeueing)")  # fmt: skip
    assert "GroupProtected" not in sh(env, "scontrol", "show", "node", "burst-cpu-14")
    await_alert(lab_config, "SlurmBurstGroupProtected", False, group="cpu")
    # enabled, with the fault gone: a job's node may be resumed again at once and the job
    # run (how soon is the machine's load); what matters is that none was lost
    kept = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "COMPLETED")
    settle(f"{times} failed launches in a row (lab)",
           "group protected (nodes drained), enabled by hand", store, cloud, lab_config, env, jobs,
           lambda: all(job_state(env, j) in kept for j in jobs))  # fmt: skip


# -- HA: two daemons, the leader killed ------------------------------------------------

PG = "postgresql+psycopg://root@127.0.0.1/postgres"


def _metrics(port: int) -> dict[str, float]:
    """``name{labels}`` -> value from a daemon's /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


@pytest.fixture
def ha_pair(lab: Lab, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The lab's daemon replaced by two daemons electing a leader through PostgreSQL,
    each with its own config (metrics port, log) as on two hosts; the lab's daemon is
    started again afterwards."""
    from slurm_burst_lab import components as c

    try:
        import sqlalchemy

        with sqlalchemy.create_engine(PG).connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    except Exception as exc:
        pytest.skip(f"HA needs the local PostgreSQL: {exc}")
    text = LAB_CONFIG.read_text()
    procs: dict[str, Any] = {}
    lab.stop("daemon")
    try:
        for node_id, port in (("lab-a", 9466), ("lab-b", 9467)):
            conf = tmp_path / f"{node_id}.toml"
            conf.write_text(
                text.replace(
                    'metrics_listen = "127.0.0.1:9466"',
                    f'metrics_listen = "127.0.0.1:{port}"\nha_url = "{PG}"',
                ).replace("log/daemon.log", f"log/daemon-{node_id}.log")
            )
            argv = [sys.executable, "-m", "slurm_burst", "--config", str(conf), "daemon",
                    "--node-id", node_id]  # fmt: skip
            procs[node_id] = c.spawn(
                argv, lab.paths.log / f"daemon-{node_id}.out", env=c.lab_env(lab.cfg) or None
            )
            if node_id == "lab-a":  # a first, so that it leads
                _await_leading(procs[node_id], lab.paths.log, node_id)
        yield procs
    finally:
        for p in procs.values():
            c.stop(p)
        lab.start("daemon")


def _await_leading(proc: Any, log_dir: Path, node_id: str, timeout: float = 60) -> None:
    """Wait until ``node_id`` heartbeats as the leader; if it dies or never leads, fail
    with what it said (its output and log) and what ``status`` shows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.alive:
        daemon = _status().get("daemon") or {}
        if daemon.get("node_id") == node_id and daemon.get("running"):
            return
        time.sleep(0.5)
    said = []
    for name in (f"daemon-{node_id}.out", f"daemon-{node_id}.log"):
        path = log_dir / name
        said.append(f"--- {name}\n" + (path.read_text(errors="replace")[-3000:]
                                        if path.exists() else "(none)"))  # fmt: skip
    pytest.fail(f"{node_id} not leading (alive={proc.alive}); status: {_status()}\n"
                + "\n".join(said))  # fmt: skip


def _status() -> dict[str, Any]:
    return dict(json.loads(invoke([*SB, "status", "--json"], expect=None).stdout or "{}"))


def test_ha_leader_killed_the_follower_takes_over(
    ha_pair: dict[str, Any],
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    cloud: Any,
    faults: Any,
) -> None:
    period = lab_config.daemon.poll_period
    wait(lambda: _status().get("followers") == ["lab-b"], 30, "lab-b standing by")
    st = _status()
    assert st["leader"] == "lab-a" and st["daemon"]["running"], st
    wait(lambda: _metrics(9467).get("slurm_burst_leader") == 0.0, 30, "lab-b's metrics")
    assert _metrics(9466)["slurm_burst_leader"] == 1.0

    node = "burst-cpu-32"
    before = {n.id for n in cloud.list_nodes()}
    job = sbatch(env, node, seconds=3)
    wait(_mid_resume(store, node), 120, f"{node} booting under lab-a")
    since = last_event_id(store)
    killed_at = time.time()
    os.kill(ha_pair["lab-a"].pid, signal.SIGKILL)

    def took_over() -> dict[str, Any] | None:
        return next((e for e in events(store, "", since) if e["event"] == "daemon.leader"), None)

    ev = wait(took_over, 4 * period, "lab-b elected")
    assert ev["detail"] == "lab-b"

    def acted() -> bool:
        last = store.last_pass() or {}
        return float(last.get("ended", 0)) > killed_at

    wait(acted, 4 * period, "a reconcile pass by lab-b")
    acted_after = float((store.last_pass() or {})["ended"]) - killed_at
    assert acted_after <= 2 * period + 2, f"lab-b acted {acted_after:.1f} s after the kill"
    settle("HA leader SIGKILLed (standby takes over)",
           f"lab-b led after {ev['at'] - killed_at:.1f} s, acted after {acted_after:.1f} s; "
           "node finished, one instance",
           store, cloud, lab_config, env, [job], completed(env, job))  # fmt: skip
    made = [n for n in cloud.list_nodes() if n.id not in before and n.name == node]
    assert len(made) == 1, [(n.id, n.state) for n in made]
    st = _status()
    assert st["leader"] == "lab-b" and st["followers"] == [], st
    assert _metrics(9467)["slurm_burst_leader"] == 1.0
