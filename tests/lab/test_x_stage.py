"""Stage-in in the lab: Slurm's burst_buffer/lua, the lab's S3 server on the cloud side,
and cloud nodes that pull, verify and hand the data to the job's user.

The data lives under the lab's state directory, which no cloud VM can see (the lab cloud
hides it): what a job on a burst node reads came through the store. Jobs run as
``games`` (Slurm gives root no burst buffer; base-passwd gives every image that user).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.accounting import JOB_USER
from slurm_burst_lab.components import lab_env
from slurm_burst_lab.images import HOST_RELEASE
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from tests.conftest import LAB_CONFIG, invoke, wait
from tests.lab.conftest import RELEASE
from tests.lab.conftest import job_fields as job

DATA = Path("/var/lib/slurm-burst-lab/data")
BUCKET = Path("/var/lib/slurm-burst-lab/s3/stage")
# The node the tests that name one use: no other lab test names it. (burst-cpu-10 was one
# of the 25 the prolog test leaves behind; in CI, on 22.05, the corrupt-object job
# named it and was still pending after 240 s.)
NODE = "burst-cpu-32"


@pytest.fixture(scope="module")
def out_dir(lab: Lab) -> Iterator[Path]:
    """Where the jobs (as games) write their output: on the shared filesystem."""
    d = Path(lab.lab.shared_dir) / "stage-jobs"
    d.mkdir(exist_ok=True)
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def dataset(name: str, files: dict[str, bytes]) -> Path:
    root = DATA / name
    shutil.rmtree(root, ignore_errors=True)
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    for p in [DATA, *root.rglob("*"), root]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def submit(
    env: dict[str, str], out_dir: Path, script: str, *args: str
) -> subprocess.CompletedProcess[str]:
    path = out_dir / f"job-{time.monotonic_ns()}.sh"
    path.write_text(script)
    path.chmod(0o755)
    # the host's sbatch runs as the user; another release's wrapper chroots first, as
    # root, then becomes the user
    other = RELEASE != HOST_RELEASE
    as_user = [] if other else ["runuser", "-u", JOB_USER, "--"]
    pw = pwd.getpwnam(JOB_USER)
    env = {**env, "SBLAB_AS_UID": f"{pw.pw_uid}:{pw.pw_gid}"} if other else env
    return subprocess.run(
        [*as_user, "sbatch", "--parsable", "-t", "5", "-A", "physics",
         "-o", f"{out_dir}/%j.out", "-D", str(out_dir), *args, str(path)],
        env=env, text=True, capture_output=True, timeout=60,
    )  # fmt: skip


def submit_ok(env: dict[str, str], out_dir: Path, script: str) -> int:
    """``submit``, which must succeed: the job's id."""
    submitted = submit(env, out_dir, script)
    assert submitted.returncode == 0, submitted.stderr
    return int(submitted.stdout.strip().split(";")[0])


def done(env: dict[str, str], job_id: int, timeout: float = 240) -> dict[str, str]:
    """Wait for the job to end; past ``timeout``, fail with what Slurm says of the job
    and of its nodes, so that a run in CI shows why."""
    deadline = time.monotonic() + timeout
    while (info := job(env, job_id)).get("JobState") not in ("COMPLETED", "FAILED", "CANCELLED"):
        if time.monotonic() > deadline:
            names = info.get("NodeList") or info.get("ReqNodeList") or ""
            nodes = subprocess.run(["scontrol", "show", "node", "-o", names], env=env,
                                   text=True, capture_output=True, timeout=30).stdout  # fmt: skip
            pytest.fail(f"job {job_id} not done after {timeout:g} s: {info}\nits nodes: {nodes}")
        time.sleep(0.2)
    return info


def held(env: dict[str, str], job_id: int) -> bool:
    return "StageSensitive" in job(env, job_id).get("Reason", "")


def bucket_bytes() -> int:
    return sum(p.stat().st_size for p in BUCKET.rglob("*") if p.is_file())


def test_a_burst_job_reads_its_data_on_the_cloud_node_verified_and_its_own(
    lab: Lab, env: dict[str, str], store: Store, out_dir: Path
) -> None:
    files = {f"shard-{i}": os.urandom(200_000 + i) for i in range(4)}
    files["meta/labels.txt"] = b"cat\ndog\n" * 2000  # compressible: stored zlib'd
    src = dataset("imagenet-mini", files)
    script = (
        "#!/bin/sh\n#SBATCH -p burst-cpu\n"
        f"#BB_LUA stage_in src={src} dst=imagenet\n"
        'echo "STAGE=$SLURM_BURST_STAGE_IMAGENET"\n'
        'cd "$SLURM_BURST_STAGE_IMAGENET" && find . -type f ! -name ".slurm-burst*" '
        "-exec sha256sum {} + | sort -k2\n"
        'stat -c "OWNER %U %a" . shard-0\n'
        f'ls {src} >/dev/null 2>&1 && echo "SOURCE VISIBLE" || echo "SOURCE HIDDEN"\n'
        '(echo x >> shard-0) 2>/dev/null && echo "WRITABLE" || echo "READ-ONLY"\n'
    )
    job_id = submit_ok(env, out_dir, script)
    info = done(env, job_id)
    assert info["JobState"] == "COMPLETED", info
    assert info["NodeList"].startswith("burst-cpu-")
    out = (out_dir / f"{job_id}.out").read_text()
    want = sorted(f"{hashlib.sha256(b).hexdigest()}  ./{rel}" for rel, b in files.items())
    got = sorted(ln for ln in out.splitlines() if "  ./" in ln)
    assert got == want, out  # every file, byte for byte
    assert f"OWNER {JOB_USER} 500" in out and f"OWNER {JOB_USER} 444" in out
    assert "SOURCE HIDDEN" in out and "READ-ONLY" in out
    assert f"STAGE=/var/lib/slurm-burst/stage/{job_id}/imagenet" in out
    rec = store.stage(job_id)
    assert rec is not None and rec.state == "staged" and rec.burst_only
    assert rec.datasets[0]["files"] == 5
    # the labels went compressed: the store holds less than the dataset
    assert rec.datasets[0]["bytes_sent"] < sum(len(b) for b in files.values())


def test_a_job_on_a_node_that_is_up_already_gets_its_data_there(
    lab: Lab, env: dict[str, str], store: Store, out_dir: Path
) -> None:
    """The node joined for an earlier job: the PrologSlurmctld asks the daemon to pull
    the new job's data onto it, and the job starts once it is there."""
    node = "burst-cpu-9"
    first = dataset("first", {"a": os.urandom(50_000)})
    second = dataset("second", {"b": os.urandom(70_000)})
    ids, instances = [], []
    for src, hold in ((first, 90), (second, 0)):  # the first runs on while the second comes
        script = (
            f"#!/bin/sh\n#SBATCH -p burst-cpu -w {node} -n1\n"
            f"#BB_LUA stage_in src={src} dst=d\n"
            f'sha256sum "$SLURM_BURST_STAGE_D"/*\nsleep {hold}\n'
        )
        ids.append(submit_ok(env, out_dir, script))
        wait(lambda: job(env, ids[-1]).get("JobState") in ("RUNNING", "COMPLETED"), 240,
             f"job {ids[-1]} runs")  # fmt: skip
        rec = store.node(node)
        assert rec is not None
        instances.append(rec.instance_id)
    assert done(env, ids[1])["JobState"] == "COMPLETED"
    subprocess.run(["scancel", str(ids[0])], env=env, timeout=30)
    assert instances[0] == instances[1]  # the same instance: no second join
    out = (out_dir / f"{ids[1]}.out").read_text()
    assert hashlib.sha256((second / "b").read_bytes()).hexdigest() in out, out
    assert node in store.pulled_on(ids[1])


def test_a_job_that_may_run_on_prem_runs_there_without_an_upload(
    lab: Lab, env: dict[str, str], store: Store, out_dir: Path
) -> None:
    src = dataset("onprem-only-run", {"x.bin": os.urandom(300_000)})
    before = bucket_bytes()
    script = (
        f"#!/bin/sh\n#SBATCH -p onprem\n#BB_LUA stage_in src={src} dst=x\n"
        'test -e "$SLURM_BURST_STAGE_X" && echo STAGED || echo "NO COPY ON $(hostname)"\n'
    )
    job_id = submit_ok(env, out_dir, script)
    info = done(env, job_id)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "onprem-1", info
    assert "NO COPY ON onprem-1" in (out_dir / f"{job_id}.out").read_text()
    rec = store.stage(job_id)
    assert rec is not None and rec.state == "deferred" and not rec.burst_only
    assert rec.datasets[0]["bytes"] == 300_000  # checked (as games), not sent
    assert bucket_bytes() == before


def test_sensitive_data_is_refused_at_submit_and_by_the_daemon_and_nothing_leaves(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store, out_dir: Path
) -> None:
    clinical = dataset("clinical/study-7", {"scan.dcm": os.urandom(100_000)})
    before = bucket_bytes()
    # under staging.onprem_only_paths: Lua's job_process refuses the job at submit
    refused = submit(env, out_dir, "#!/bin/sh\n#SBATCH -p burst-cpu\n"
                     f"#BB_LUA stage_in src={clinical} dst=s\nhostname\n")  # fmt: skip
    assert refused.returncode != 0
    assert f"stage of {clinical} refused" in refused.stderr
    assert "which stays on-prem" in refused.stderr
    # a way around the path rule (a symlink) is resolved by the daemon, as the user
    link = DATA / "innocent"
    link.unlink(missing_ok=True)
    link.symlink_to(clinical)
    # and a data owner's marker keeps a directory home too
    marked = dataset("marked", {"a.txt": b"private\n", ".slurm-burst-onprem-only": b""})
    for src in (link, marked):
        job_id = submit_ok(env, out_dir, "#!/bin/sh\n#SBATCH -p burst-cpu\n"
                           f"#BB_LUA stage_in src={src} dst=s\nhostname\n")  # fmt: skip
        try:
            wait(partial(held, env, job_id), 60, f"job {job_id} held with the reason")  # fmt: skip
            info = job(env, job_id)
            assert info["JobState"] == "PENDING", info
            rec = store.stage(job_id)
            assert rec is not None and rec.state == "kept_home"
        finally:
            subprocess.run(["scancel", str(job_id)], env=env, timeout=30)
    link.unlink()
    assert bucket_bytes() == before  # zero bytes left the site


def test_a_corrupt_object_in_the_store_never_reaches_the_job_and_is_sent_again(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store, out_dir: Path
) -> None:
    """The dataset was pre-staged, then one of its objects was cut short in the bucket.
    The node's pull fetches it again and again and never accepts it; the daemon drops
    the bad object, pushes the stage again (as the job's user), and the node pulls once
    more: the job runs on whole data, on the same instance, never requeued. Each
    transfer is in the ledger."""
    files = {"a.bin": os.urandom(400_000), "b.bin": os.urandom(300_000)}
    src = dataset("corrupted", files)
    keys = lab_env(lab_config)  # the store's keys, as the lab's daemon has them
    push = ["--config", str(LAB_CONFIG), "stage", "push", str(src), "-A", "physics",
            "--as-user", JOB_USER, "--json"]  # fmt: skip
    pushed = json.loads(invoke(push, env=keys).stdout)
    sha = hashlib.sha256(files["a.bin"]).hexdigest()
    [obj] = [p for p in BUCKET.rglob(f"{sha}*") if p.is_file()]
    obj.write_bytes(obj.read_bytes()[:1000])  # cut short where it is stored
    node = NODE
    script = (f"#!/bin/sh\n#SBATCH -p burst-cpu -w {node} -n1\n"
              f"#BB_LUA stage_in src={src} dst=d\n"
              'cd "$SLURM_BURST_STAGE_D" && sha256sum a.bin b.bin\n'
              'stat -c "OWNER %U %a" . a.bin\n'
              f'ls {src} >/dev/null 2>&1 && echo "SOURCE VISIBLE" || echo "SOURCE HIDDEN"\n'
              '(echo x >> a.bin) 2>/dev/null && echo "WRITABLE" || echo "READ-ONLY"\n')  # fmt: skip
    job_id = submit_ok(env, out_dir, script)
    info = done(env, job_id)
    # never requeued: the node it was given pulled again (a node of another test may
    # still be up: then the prolog's pull does the same)
    assert info["JobState"] == "COMPLETED" and info.get("Restarts") == "0", info
    out = (out_dir / f"{job_id}.out").read_text()
    for name, body in files.items():
        assert f"{hashlib.sha256(body).hexdigest()}  {name}" in out, out
    assert f"OWNER {JOB_USER} 500" in out and f"OWNER {JOB_USER} 444" in out
    assert "SOURCE HIDDEN" in out and "READ-ONLY" in out
    assert obj.stat().st_size > 1000  # sent again, whole
    rec = store.stage(job_id)
    assert rec is not None and rec.state == "staged"
    moved = json.loads(invoke(["--config", str(LAB_CONFIG), "ledger", "transfers", "--job",
                               str(job_id), "--json"]).stdout)  # fmt: skip
    by = sorted((t["direction"], t["node"]) for t in moved)
    # the first push found the pre-staged dataset (nothing sent), the second sent the
    # object again; the one pull that succeeded (the failed one is a metric, not a row)
    assert by == [("in", ""), ("in", ""), ("pull", node)], moved  # one node, one pull
    assert sum(t["bytes_sent"] for t in moved if t["direction"] == "in") >= len(files["a.bin"])
    assert pushed["objects_sent"] == 2


def test_each_task_of_an_array_gets_its_data(
    lab: Lab, env: dict[str, str], store: Store, out_dir: Path
) -> None:
    """squeue --jobs=ID of an array's own id lists every task: each task's stage-in finds
    its own line (its own job id, %A), and each task reads the data on its node."""
    src = dataset("array-input", {"x.txt": b"for every task\n"})
    script = (f"#!/bin/sh\n#SBATCH -p burst-cpu -w {NODE} -n1\n"
              f"#BB_LUA stage_in src={src} dst=x\n"
              'echo "TASK $SLURM_ARRAY_TASK_ID $(cat "$SLURM_BURST_STAGE_X/x.txt")"\n')  # fmt: skip
    submitted = submit(env, out_dir, script, "--array=1-3")
    assert submitted.returncode == 0, submitted.stderr
    array = int(submitted.stdout.strip().split(";")[0])

    def tasks() -> list[str]:
        return subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", str(array), "-o", "JobIDRaw,State"], env=env,
            text=True, capture_output=True, timeout=30).stdout.split()  # fmt: skip

    wait(lambda: len(tasks()) == 3 and all(t.endswith("|COMPLETED") for t in tasks()), 300,
         f"array {array}'s 3 tasks done")  # fmt: skip
    said = "".join(p.read_text() for p in out_dir.glob("*.out") if p.stem.isdigit()
                   and int(p.stem) in {int(t.split("|")[0]) for t in tasks()})  # fmt: skip
    assert sorted(ln for ln in said.splitlines() if ln.startswith("TASK")) == [
        f"TASK {i} for every task" for i in (1, 2, 3)
    ], said
    assert {store.stage(int(t.split("|")[0])).state for t in tasks()} == {"staged"}  # type: ignore[union-attr]


def test_a_failed_stage_in_holds_the_job_until_released_then_runs_it_again(
    lab: Lab, env: dict[str, str], store: Store, out_dir: Path
) -> None:
    """The source is not there yet: stage-in fails, Slurm holds the job with the reason;
    once the data is there, `scontrol release` runs stage-in again (burst_buffer.conf's
    Flags=TeardownFailure) and the job runs with it."""
    src = DATA / "arrives-late"
    shutil.rmtree(src, ignore_errors=True)
    script = (f"#!/bin/sh\n#SBATCH -p burst-cpu -w {NODE} -n1\n"
              f"#BB_LUA stage_in src={src} dst=n\n"
              'cat "$SLURM_BURST_STAGE_N/late.txt"\n')  # fmt: skip
    job_id = submit_ok(env, out_dir, script)
    try:
        wait(lambda: (rec := store.stage(job_id)) is not None and rec.state == "failed", 60,
             f"job {job_id}'s stage to fail")  # fmt: skip
        wait(lambda: "StageBadInput" in job(env, job_id).get("Reason", "")
             and job(env, job_id).get("Priority") == "0", 60, f"job {job_id} held")  # fmt: skip
        dataset("arrives-late", {"late.txt": b"the data arrived\n"})
        subprocess.run(["scontrol", "release", str(job_id)], env=env, check=True, timeout=30)
        info = done(env, job_id)
    finally:
        subprocess.run(["scancel", str(job_id)], env=env, timeout=30)
    assert info["JobState"] == "COMPLETED", info
    assert "the data arrived" in (out_dir / f"{job_id}.out").read_text()
    assert store.stage(job_id).state == "staged"  # type: ignore[union-attr]


def test_a_burst_buffer_jobs_node_that_fails_to_join_gets_a_new_instance_not_a_requeue(
    lab: Lab, env: dict[str, str], store: Store, out_dir: Path,
    faults: Callable[[list[dict[str, Any]]], None],
) -> None:  # fmt: skip
    """The node's first instance never completes its WireGuard handshake. Failing the
    node would requeue the job, and Slurm never starts a requeued burst-buffer job whose
    stage-in was waiting for its nodes; the daemon gives the node a new instance
    instead, within ResumeTimeout: the job runs once, never requeued."""
    node = "burst-cpu-3"
    wait(lambda: sinfo_state(env, node) == "idle~", 180, f"{node} powered down")
    since = max((e["id"] for e in store.events()), default=0)
    faults([{"call": "create_node", "node": node, "times": 1,
             "block": ["ipproto udp dport 51820"]}])  # fmt: skip
    src = dataset("replaced", {"r.bin": os.urandom(100_000)})
    script = (f"#!/bin/sh\n#SBATCH -p burst-cpu -w {node} -n1\n"
              f"#BB_LUA stage_in src={src} dst=r\n"
              'sha256sum "$SLURM_BURST_STAGE_R/r.bin"\n')  # fmt: skip
    job_id = submit_ok(env, out_dir, script)
    info = done(env, job_id)
    assert info["JobState"] == "COMPLETED" and info.get("Restarts") == "0", info
    out = (out_dir / f"{job_id}.out").read_text()
    assert hashlib.sha256((src / "r.bin").read_bytes()).hexdigest() in out, out
    replaced = [e for e in store.events(since) if e["event"] == "node.replaced"]
    assert [(e["node"], e["detail"].split(":")[0]) for e in replaced] == [
        (node, "WireGuardHandshake")
    ], replaced
    failed = [e for e in store.events(since) if e["event"] == "node.failed" and e["node"] == node]
    assert failed == [], failed  # Slurm never saw it fail


def sinfo_state(env: dict[str, str], node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], env=env, text=True,
                          capture_output=True, timeout=30).stdout.strip()  # fmt: skip


RESULTS = Path("/var/lib/slurm-burst-lab/results")  # on-prem: no cloud VM sees it


@pytest.fixture(scope="module")
def results() -> Iterator[Path]:
    RESULTS.mkdir(exist_ok=True)
    RESULTS.chmod(0o1777)  # the jobs' user writes its outputs' homes here
    yield RESULTS
    shutil.rmtree(RESULTS, ignore_errors=True)


def outputs_of(store: Store, job_id: int) -> list[Any]:
    return store.outputs(job_id)


@pytest.mark.full  # 3 min: make test-full only (docs/testing.md, the time budget)
def test_a_job_killed_by_a_reclaim_resumes_from_its_last_synced_checkpoint(
    lab: Lab, env: dict[str, str], store: Store, cloud: Any, out_dir: Path, results: Path
) -> None:
    """The job counts steps into its checkpoint directory, synced every 10 s. Its
    instance is destroyed mid-run (a spot reclaim); Slurm requeues it, and on its new
    instance the job finds the last synced step and goes on from there."""
    node = "burst-cpu-31"
    script = (
        f"#!/bin/sh\n#SBATCH -p burst-cpu -w {node} -n1 --requeue\n"
        f"#BB_LUA stage_out src=ckpt dst={results}/%j sync=10\n"
        'cd "$SLURM_BURST_STAGE_CKPT"\n'
        'if [ -f step ]; then echo "RESUMED FROM $(cat step)"; else echo "FRESH START"; fi\n'
        "n=$(cat step 2>/dev/null || echo 0)\n"
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then echo $((n + 1000)) > step; exit 0; fi\n'
        "while true; do n=$((n + 1)); echo $n > step.tmp && mv step.tmp step; sleep 1; done\n"
    )
    job_id = submit_ok(env, out_dir, script)
    wait(lambda: any(o.state == "synced" and o.files == 1 for o in outputs_of(store, job_id)),
         240, f"job {job_id}'s first checkpoint synced")  # fmt: skip
    [synced] = outputs_of(store, job_id)
    rec = store.node(node)
    assert rec is not None and rec.instance_id
    doomed = next(n for n in cloud.list_nodes() if n.id == rec.instance_id)
    cloud.destroy_node(doomed)  # a spot reclaim

    # requeued: Restarts counts it at once, whatever state the requeue is in (Slurm may
    # show it REQUEUED, completing, while burst_buffer/lua tears its stage-out down)
    def restarted() -> dict[str, str]:
        info = job(env, job_id)
        return info if info.get("Restarts", "0") != "0" else {}

    requeued = wait(restarted, 240, f"job {job_id} requeued")
    assert requeued["JobState"] in ("PENDING", "REQUEUED", "COMPLETING", "CONFIGURING",
                                    "RUNNING"), requeued  # fmt: skip
    # Slurm holds a requeued batch job back a while (its BeginTime): not what is tested
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env,
                   capture_output=True, timeout=30, check=False)  # fmt: skip
    info = done(env, job_id, timeout=400)
    assert info["JobState"] == "COMPLETED" and int(info.get("Restarts", "0")) >= 1, info
    said = (out_dir / f"{job_id}.out").read_text()
    assert "RESUMED FROM " in said, said
    resumed = int(said.split("RESUMED FROM ", 1)[1].split()[0])
    assert resumed >= 1  # what was synced before the reclaim, not a fresh start
    wait(lambda: [o.state for o in outputs_of(store, job_id)] == ["sealed"], 120,
         f"job {job_id}'s outputs sealed")  # fmt: skip
    assert int((results / str(job_id) / "step").read_text()) == resumed + 1000
    assert synced.manifest  # the version the second run started from was in the store


def test_outputs_come_home_verified_and_their_node_outlives_suspend_time_until_they_do(
    lab: Lab, env: dict[str, str], store: Store, out_dir: Path, results: Path
) -> None:
    """stage_out: the job writes into $SLURM_BURST_STAGE_OUT on the cloud node (and plants
    a symlink to a file of root's). Its destination cannot take them yet (its directory
    is root's): the promotion fails and is tried again, and the node, suspended by Slurm
    after its SuspendTime (30 s), is kept. Meanwhile a byte of the checkpoint's object
    flips in the store: the next promotion finds it, replaces nothing, and the held node
    sends that file again. Once the directory is open, the outputs land at
    locked/<job id>, the job user's, byte for byte, and only then is the node
    released."""
    locked = results / "locked"
    locked.mkdir(exist_ok=True)
    locked.chmod(0o755)  # root's: the job's user cannot write here yet
    script = (
        f"#!/bin/sh\n#SBATCH -p burst-cpu -w {NODE} -n1\n"
        f"#BB_LUA stage_out src=out dst={locked}/%j\n"
        'cd "$SLURM_BURST_STAGE_OUT" && mkdir -p ckpt\n'
        "head -c 3000000 /dev/urandom > ckpt/model.pt\n"
        "hostname > host.txt && ln -s /etc/shadow shadow\n"
        'stat -c "OWNER %U %a" .\n'
        "sha256sum ckpt/model.pt host.txt\n"
    )
    job_id = submit_ok(env, out_dir, script)
    assert done(env, job_id)["JobState"] == "COMPLETED"
    ended = time.monotonic()  # the node idles from here: SuspendTime (30 s) counts
    said = (out_dir / f"{job_id}.out").read_text()
    assert f"OWNER {JOB_USER} 700" in said, said
    wait(lambda: any(o.state == "ended" and "not home yet" in o.message
                     for o in outputs_of(store, job_id)), 120,
         f"job {job_id}'s promotion failing")  # fmt: skip
    model = next(line.split()[0] for line in said.splitlines() if line.endswith("ckpt/model.pt"))
    [stored] = list(BUCKET.rglob(f"{model}*"))  # the checkpoint's object, as the store keeps it
    body = bytearray(stored.read_bytes())
    body[len(body) // 2] ^= 0x01
    stored.write_bytes(bytes(body))
    wait(lambda: any(e["event"] == "node.held_for_outputs" and e["node"] == NODE
                     for e in store.events(since_id=0, limit=100000)), 120,
         f"{NODE} held for its outputs")  # fmt: skip
    while time.monotonic() - ended < 45:  # well past its SuspendTime: still there
        rec = store.node(NODE)
        assert rec is not None and str(rec.state) == "joined", rec
        time.sleep(1)
    locked.chmod(0o1777)
    wait(lambda: [o.state for o in outputs_of(store, job_id)] == ["sealed"], 120,
         f"job {job_id}'s outputs sealed")  # fmt: skip
    home = locked / str(job_id)
    for line in said.splitlines():
        if "  " in line and not line.startswith("OWNER"):
            digest, name = line.split("  ", 1)
            assert hashlib.sha256((home / name).read_bytes()).hexdigest() == digest, name
    assert sorted(p.name for p in home.iterdir()) == ["ckpt", "host.txt"]  # no symlink
    assert pwd.getpwuid(home.stat().st_uid).pw_name == JOB_USER
    assert (home / "host.txt").read_text().strip() == NODE
    [out] = outputs_of(store, job_id)
    assert (out.files, out.node) == (2, NODE) and "verified" in out.message, out
    events = store.events(since_id=0, limit=100000)
    again = [e["detail"] for e in events if e["event"] == "output.sent_again"
             and e["detail"].startswith(f"job {job_id} ")]  # fmt: skip
    assert again == [f"job {job_id} out: 1 files came back from the store wrong"], again
    sealed = max(e["id"] for e in events if e["event"] == "output.sealed"
                 and e["detail"].startswith(f"job {job_id} "))  # fmt: skip
    wait(lambda: str(getattr(store.node(NODE), "state", "")) == "terminated", 120,
         f"{NODE} released once its outputs were home")  # fmt: skip
    after = store.events(since_id=sealed, limit=100000)
    assert any(e["node"] == NODE and e["event"] == "node.terminating" for e in after), after
