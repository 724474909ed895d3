"""Stage-in's hook and the daemon's stage work together: when data moves, and for whom.

The state store is the in-memory one; the pusher records what it was asked (the real
one, a child ``stage push --as-user``, is tested in tests/integration/test_staging.py
and in the lab)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.config import Config, load_config
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.records import StageRecord, StageState
from slurm_burst.core.slurm import JobOwner, array_script, parse_job_owner
from slurm_burst.core.staging import SensitiveData
from slurm_burst.services.stagehook import StageInResult, run_stage_in
from slurm_burst.services.stagework import StageWork, StageWorkSettings
from slurm_burst.wiring.light import node_store
from tests.conftest import invoke, lab_config_in
from tests.fakes.store import MemoryStore
from tests.unit.test_burst_buffer_lua import STAGING
from tests.unit.test_config import GOOD, write

SCRIPT = "#!/bin/sh\n#BB_LUA stage_in src=/data/set dst=set\nsrun x\n"


class RealClock:
    """Real time, short sleeps: the hook's wait and the worker's thread both run."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.01))


class Owners:
    def __init__(self, partitions: tuple[str, ...], account: str = "phys") -> None:
        self.partitions, self.account = partitions, account

    def job_owner(self, job_id: int) -> JobOwner:
        return JobOwner(job_id, "alice", 1001, 1001, self.account, "", self.partitions)


class Pusher:
    """Records each push; refuses sources under /secret as the real one would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []

    def push(self, user: str, src: str, account: str, qos: str, *, check: bool) -> dict[str, Any]:
        self.calls.append((user, src, check))
        if src.startswith("/secret"):
            raise SensitiveData(f"stage of {src} refused: /secret stays on-prem")
        if check:
            return {"src": src, "real_src": src, "files": 3, "bytes": 300}
        return {"src": src, "manifest": "ab" * 32, "files": 3, "bytes": 300, "bytes_sent": 300}


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return load_config(write(tmp_path, GOOD + STAGING))


def stage_in(
    cfg: Config, store: MemoryStore, owners: Owners, work: StageWork, script: str = SCRIPT
) -> StageInResult:
    """The hook in a thread (as slurmscriptd runs it), the daemon's passes meanwhile."""
    out: list[StageInResult] = []
    clock = RealClock()
    store.beat(time.time(), {})  # the daemon runs
    hook = threading.Thread(
        target=lambda: out.append(
            run_stage_in(
                "42",
                script,
                cfg,
                store=store,
                owners=owners,
                clock=clock,
                wake=lambda: None,
            )
        )
    )
    hook.start()
    deadline = time.monotonic() + 10
    while hook.is_alive() and time.monotonic() < deadline:
        store.beat(time.time(), {})
        work.pass_once()
        time.sleep(0.005)
    hook.join(timeout=1)
    assert out, "the hook did not return"
    return out[0]


def worker(store: MemoryStore, pusher: Pusher) -> StageWork:
    return StageWork(StageWorkSettings(), store, pusher, RealClock())


def wait_state(store: MemoryStore, want: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        rec = store.stage(42)
        if rec is not None and rec.state == want:
            return
        time.sleep(0.005)
    pytest.fail(f"stage of job 42 not {want}: {store.stage(42)}")


def test_a_burst_only_job_waits_until_its_data_is_stored(cfg: Config) -> None:
    store, pusher = MemoryStore(), Pusher()
    result = stage_in(cfg, store, Owners(("burst-gpu",)), worker(store, pusher))
    assert result.code == 0
    assert pusher.calls == [("alice", "/data/set", False)]  # pushed as the job's user
    rec = store.stage(42)
    assert rec is not None and rec.state == StageState.STAGED and rec.burst_only
    assert rec.datasets[0]["manifest"] == "ab" * 32 and rec.datasets[0]["dst"] == "set"


def test_a_job_that_may_run_on_prem_never_waits_for_an_upload(cfg: Config) -> None:
    """Checked (as its user), not sent: the push starts only when Slurm resumes a cloud
    node for the job, and the node's join waits for it."""
    store, pusher = MemoryStore(), Pusher()
    work = worker(store, pusher)
    result = stage_in(cfg, store, Owners(("batch", "burst-gpu")), work)
    assert result.code == 0
    assert pusher.calls == [("alice", "/data/set", True)]  # a check: nothing read or sent
    assert store.stage(42).state == StageState.DEFERRED  # type: ignore[union-attr]
    for _ in range(20):
        work.pass_once()
    assert len(pusher.calls) == 1  # no cloud node for it: nothing moves
    # Slurm resumes a cloud node for job 42: the push starts
    store.transition("gpu-01", NodeState.REQUESTED, time.time(), group="gpu",
                     jobs='[{"job_id": 42, "nodes": "gpu-01"}]')  # fmt: skip
    work.pass_once()
    wait_state(store, StageState.STAGED)
    assert pusher.calls[1] == ("alice", "/data/set", False)


def test_sensitive_data_holds_a_burst_only_job_and_keeps_any_other_home(cfg: Config) -> None:
    secret = "#!/bin/sh\n#BB_LUA stage_in src=/secret/scans dst=s\n"
    store, pusher = MemoryStore(), Pusher()
    held = stage_in(cfg, store, Owners(("burst-gpu",)), worker(store, pusher), secret)
    assert held.code == 1 and "StageSensitive" in held.message and "/secret" in held.message
    assert store.stage(42).state == StageState.KEPT_HOME  # type: ignore[union-attr]
    store2, pusher2 = MemoryStore(), Pusher()
    home = stage_in(cfg, store2, Owners(("batch", "burst-gpu")), worker(store2, pusher2), secret)
    assert home.code == 0  # it runs on-prem; the policy never sends it (test_burst_policy)
    assert store2.stage(42).state == StageState.KEPT_HOME  # type: ignore[union-attr]
    # the burst-only job's push refused itself before reading a byte (the real pusher's
    # zero bytes: tests/integration/test_staging.py); the other job's was only checked
    assert pusher.calls == [("alice", "/secret/scans", False)]
    assert pusher2.calls == [("alice", "/secret/scans", True)]


def test_a_job_that_may_run_on_prem_does_not_wait_for_a_stopped_daemon(cfg: Config) -> None:
    store = MemoryStore()
    store.beat(time.time() - 3600, {})
    result = run_stage_in("42", SCRIPT, cfg, store=store, owners=Owners(("batch",)),
                          clock=RealClock(), wake=lambda: None)  # fmt: skip
    assert result.code == 0 and store.stage(42).state == StageState.REQUESTED  # type: ignore[union-attr]


def test_stage_in_again_finds_the_record_and_a_failed_one_starts_over(cfg: Config) -> None:
    """A slurmctld restart runs stage-in again: no second push of what is stored."""
    store, pusher = MemoryStore(), Pusher()
    work = worker(store, pusher)
    assert stage_in(cfg, store, Owners(("burst-gpu",)), work).code == 0
    assert stage_in(cfg, store, Owners(("burst-gpu",)), work).code == 0
    assert len(pusher.calls) == 1
    store.update_stage(42, time.time(), state=StageState.FAILED, message="store down")
    assert stage_in(cfg, store, Owners(("burst-gpu",)), work).code == 0
    assert len(pusher.calls) == 2


@pytest.mark.parametrize(
    ("job", "script", "says"),
    [("4x2", SCRIPT, "not a number"),
     ("42", "#!/bin/sh\n#BB_LUA stage_in src=/a/../b dst=x\n", "line 2")],
)  # fmt: skip
def test_bad_input_is_said_and_nothing_recorded(
    cfg: Config, job: str, script: str, says: str
) -> None:
    store = MemoryStore()
    result = run_stage_in(job, script, cfg, store=store, owners=Owners(("burst-gpu",)),
                          clock=RealClock(), wake=lambda: None)  # fmt: skip
    assert result.code == 2 and says in result.message and store.stages() == []


@pytest.mark.parametrize(
    ("text", "says"),
    [("42|alice|1001|1001|phys|normal|burst-cpu,batch|42\n", None),
     ("42|alice|1001|1001|phys||burst-cpu|42\n", None),
     ("", "0 lines"),
     # an array's own id lists its tasks too: the job is the line of its own id (%A)
     ("43|bob|1002|1002|phys|normal|p|43\n42|alice|1001|1001|phys|normal|burst-cpu|42\n"
      "44|carol|1003|1003|phys|normal|p|44\n", None),
     ("42|alice|1001|1001|phys|normal|p|42\n42|mallory|1|1|phys|normal|p|42\n",
      "2 lines of job 42"),
     ("42|alice|x|1001|phys|normal|p|42\n", "not numbers"),
     ("43|alice|1001|1001|phys|normal|p|43\n", "0 lines of job 42"),
     ("42_2|alice|1001|1001|phys|normal|p|42\n", "0 lines of job 42"),  # %A: an id, not TASK
     ("42|al ice|1001|1001|phys|normal|p|42\n", "not a Slurm name"),
     ("42|alice|1001|1001|phys|normal|p|x|42\n", "9 fields")],
)  # fmt: skip
def test_whose_job_is_read_from_fields_a_user_cannot_write(text: str, says: str | None) -> None:
    if says is None:
        owner = parse_job_owner(text, 42)
        assert owner.uid == 1001 and owner.partitions[0] == "burst-cpu"
        assert owner.array_job_id == 0  # no array task (%F is its own id)
    else:
        with pytest.raises(ValueError, match=says):
            parse_job_owner(text, 42)


def test_an_array_task_knows_its_array_and_where_slurm_keeps_its_script() -> None:
    owner = parse_job_owner("44|alice|1001|1001|phys|normal|burst-cpu|42\n", 44)
    assert owner.array_job_id == 42
    given = "/var/spool/slurmctld/hash.4/job.44/script"  # what 24.11 hands task 44
    assert array_script(given, 44, 42) == "/var/spool/slurmctld/hash.2/job.42/script"
    assert array_script(given, 44, 0) is None  # no array task
    assert array_script(given, 45, 42) is None  # another job's path
    assert array_script("/tmp/../etc/passwd", 44, 42) is None  # not Slurm's shape
    assert array_script("/s/hash.4/job.44/script/../../x", 44, 42) is None


def test_stage_jobs_shows_each_stage_and_why(tmp_path: Path) -> None:
    """The operator's view: `slurm-burst stage jobs`, as a table and as JSON."""
    cfg = lab_config_in(tmp_path)
    store = node_store(cfg)
    for job_id, state, message in ((41, "staged", "stored; 300 bytes sent"),
                                   (42, "kept_home", "StageSensitive: under /secret")):  # fmt: skip
        store.add_stage(StageRecord(
            owner=JobOwner(job_id, "alice", 1001, 1001, "phys", "", ("burst-cpu",)),
            burst_only=True, stages=[{"src": "/d", "dst": "d"}],
            state=state, message=message, datasets=[{"dst": "d", "bytes": 300, "bytes_sent": 300}],
            created_at=1.0, updated_at=2.0,
        ))  # fmt: skip
    store.close()
    base = ["--config", cfg.source, "stage", "jobs"]
    doc = json.loads(invoke([*base, "--json", "--state", "kept_home"]).stdout)
    assert [s["job_id"] for s in doc["stages"]] == [42]
    assert doc["stages"][0]["message"] == "StageSensitive: under /secret"
    table = invoke(base).stdout
    assert "41" in table and "kept_home" in table and "StageSensitive" in table
