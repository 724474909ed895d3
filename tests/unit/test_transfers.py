"""What staging's transfers cost, and that each lands in the ledger once.

The ledger is the in-memory one (the SQL one keeps the same contract:
tests/contracts/ledger.py; its reports: tests/integration/test_ledger.py); a node's
pull is answered by a shell that says what ``node/stagein.py`` would."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.adapters.ledger.spool import Spool, SpoolingLedger
from slurm_burst.core.errors import StepError
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.pricing import (
    GB,
    MONTH_SECONDS,
    bytes_cost_micros,
    storage_cost_micros,
    stored_byte_seconds,
)
from slurm_burst.core.records import StageRecord, StageState
from slurm_burst.core.slurm import JobOwner
from slurm_burst.core.staging import Entry, Layout, Manifest, namespace, pointer_body
from slurm_burst.services.nodestage import NodeStaging, NodeStagingSettings
from slurm_burst.services.stagework import StageWork, StageWorkSettings
from slurm_burst.services.staging import Held, Stager, StagingSettings
from slurm_burst.services.transfers import StorageBook, StorePrices, TransferBook
from tests.fakes.ledger import FakeLedger
from tests.fakes.store import MemoryStore
from tests.unit.test_stage_in import Pusher, RealClock

PRICES = StorePrices(store="s3-lab", provider="lab", upload_per_gb=0.5, download_per_gb=0.02,
                     storage_per_gb_month=0.25)  # fmt: skip
OWNER = JobOwner(42, "alice", 1001, 1001, "phys", "", ("burst-gpu",))


class Said:
    """The Metrics port's transfer(), recorded (the rest of the port is not called)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool, int]] = []

    def transfer(
        self, direction: str, store: str, ok: bool, bytes_sent: int, seconds: float
    ) -> None:
        self.calls.append((direction, store, ok, bytes_sent))


class Fixed:
    def __init__(self, t: float = 1_790_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.mark.parametrize(
    ("n", "per_gb", "micros"),
    [(GB, 0.5, 500_000), (GB // 2, 0.09, 45_000), (0, 1.0, 0), (1, 0.5, 0),
     (536, 1.0, 0), (GB * 1024, 0.023, 23_552_000)],
    ids=["one-GB", "half", "nothing", "one-byte", "rounds-down", "a-TB"],
)  # fmt: skip
def test_bytes_cost_is_per_gb_of_2_30_bytes_to_the_micro_dollar(
    n: int, per_gb: float, micros: int
) -> None:
    assert bytes_cost_micros(n, round(per_gb * 1_000_000)) == micros


def test_a_push_pays_its_bytes_and_an_unchanged_one_nothing() -> None:
    led, said = FakeLedger(), Said()
    book = TransferBook("c", PRICES, Fixed(), led, said)  # type: ignore[arg-type]
    out = {"src": "/data/set", "manifest": "ab" * 32, "files": 3, "bytes": 4 * GB,
           "objects": 3, "objects_sent": 2, "bytes_sent": 2 * GB, "seconds": 10.0}  # fmt: skip
    t = book.pushed(out, account="phys", user="alice", job_id=42, dst="set", stage_id="1.0")
    assert (t.direction, t.bytes_sent, t.logical_bytes, t.objects_sent) == ("in", 2 * GB, 4 * GB, 2)
    assert t.cost_micros == 2 * 500_000  # the upload; storage is stage gc's to book
    book.pushed(out, account="phys", user="alice", job_id=42, dst="set", stage_id="1.0")
    assert list(led.moved) == [t.key]  # the same push again: one row
    same = book.pushed({**out, "unchanged": True, "bytes_sent": 0, "objects_sent": 0},
                       account="phys", user="alice", job_id=43, dst="set")  # fmt: skip
    assert same.cost_micros == 0 and same.objects_sent == 0 and len(led.moved) == 2
    assert said.calls == [("in", "s3-lab", True, 2 * GB)] * 2 + [("in", "s3-lab", True, 0)]


def test_an_admins_pushes_are_each_a_row_and_a_pull_pays_the_download_price() -> None:
    led, clock = FakeLedger(), Fixed()
    book = TransferBook("c", PRICES, clock, led)
    out = {"src": "/data/set", "manifest": "cd" * 32, "bytes": 10, "bytes_sent": 10}
    a = book.pushed(out, account="phys", user="root")
    clock.t += 60
    b = book.pushed(out, account="phys", user="root")
    assert a.key != b.key and a.job_id == b.job_id == 0
    pulled = book.pulled({"fetched_bytes": GB, "files": 7, "bytes": GB, "seconds": 2.5},
                         account="phys", user="alice", job_id=42, dst="set", node="gpu-01",
                         provider="aws", manifest="cd" * 32)  # fmt: skip
    assert (pulled.direction, pulled.node, pulled.provider) == ("pull", "gpu-01", "aws")
    assert pulled.cost_micros == 20_000 and pulled.objects_sent == 7  # no storage on a pull


@pytest.mark.parametrize("bad", [None, "12", -5, True, 1e400, float("nan")], ids=repr)
def test_a_garbled_answer_costs_nothing_and_records_zero(bad: object) -> None:
    book = TransferBook("c", PRICES, Fixed(), FakeLedger())
    t = book.pulled({"fetched_bytes": bad, "seconds": bad, "files": bad}, account="a",
                    user="u", job_id=1, dst="d", node="n", provider="p", manifest="")  # fmt: skip
    assert (t.bytes_sent, t.seconds, t.cost_micros, t.objects) == (0, 0.0, 0, 0)


def test_a_transfer_waits_in_the_spool_while_the_ledger_is_away_and_lands_once(
    tmp_path: Path,
) -> None:
    led = FakeLedger()
    spooling = SpoolingLedger(led, Spool(tmp_path / "spool"))
    book = TransferBook("c", PRICES, Fixed(), spooling)
    led.away = True
    t = book.pushed({"src": "/d", "manifest": "ef" * 32, "bytes_sent": 5}, account="a",
                    user="u", job_id=7, dst="d")  # fmt: skip
    assert spooling.pending() == 1 and led.moved == {}
    led.away = False
    assert spooling.replay() == 1 and spooling.pending() == 0
    assert led.moved == {t.key: t}  # as written: the spool's JSON holds every field
    spooling.transfer(t)  # written again (a restart): still one
    assert len(led.moved) == 1


def test_the_daemons_push_for_a_job_is_in_the_ledger_and_a_failed_one_in_the_metrics() -> None:
    store, led, said = MemoryStore(), FakeLedger(), Said()
    book = TransferBook("c", PRICES, Fixed(), led, said)  # type: ignore[arg-type]
    work = StageWork(StageWorkSettings(), store, Pusher(), RealClock(), book=book)
    for job, src in ((42, "/data/set"), (43, "/data/gone")):
        store.add_stage(StageRecord(
            owner=JobOwner(job, "alice", 1001, 1001, "phys", "", ("burst-gpu",)),
            burst_only=True, stages=[{"src": src, "dst": "set"}], state=StageState.REQUESTED,
            created_at=time.time(), updated_at=time.time(),
        ))  # fmt: skip

    class Failing(Pusher):
        def push(self, user: str, src: str, account: str, qos: str, *, check: bool) -> Any:
            if src == "/data/gone":
                from slurm_burst.core.staging import StorageError

                raise StorageError("store said 500", "InternalError")
            return super().push(user, src, account, qos, check=check)

    work.pusher = Failing()
    work.pass_once()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        s.state in (StageState.REQUESTED, StageState.PUSHING) for s in store.stages()
    ):
        time.sleep(0.005)
    work.shutdown()
    assert {s.job_id: s.state for s in store.stages()} == {42: "staged", 43: "failed"}
    [t] = led.moved.values()
    assert (t.job_id, t.user, t.account, t.bytes_sent, t.dataset) == (
        42, "alice", "phys", 300, "/data/set")  # fmt: skip
    assert sorted(said.calls) == [("in", "s3-lab", False, 0), ("in", "s3-lab", True, 300)]


# -- a node's pull ----------------------------------------------------------------------


class MemoryObjects:
    """An object store in a dict (the port's calls NodeStaging and Stager.drop make)."""

    name = "s3-lab"
    upload_headers: dict[str, str] = {}

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def has(self, key: str) -> bool:
        return key in self.objects

    def read(self, key: str, limit: int) -> bytes | None:
        return self.objects.get(key)

    def write_bytes(self, key: str, body: bytes) -> int:
        self.objects[key] = body
        return len(body)

    def grant(self, key: str, seconds: int, method: str = "GET") -> str:
        return f"http://store.invalid/{key}?X-Amz-Expires={seconds}"

    def keys(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        return iter(sorted((k, len(v), 0.0) for k, v in self.objects.items()
                           if k.startswith(prefix)))  # fmt: skip

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)


class Shell:
    """A node's SSH session that answers the puller with each of ``answers`` in turn."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers, self.ran = list(answers), list[Sequence[str]]()

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        self.ran.append(list(argv))
        return json.dumps(self.answers.pop(0)) + "\n"

    def put(self, data: bytes, path: str, mode: int, owner: Any = None) -> None:
        pass

    def close(self) -> None:
        pass


class Pushing(Fixed):
    """The daemon meanwhile: a stage sent back to be pushed is stored again."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__()
        self.store, self.seen = store, list[str]()

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        rec = self.store.stage(42)
        assert rec is not None
        self.seen.append(rec.state)
        self.store.update_stage(42, self.t, state=StageState.STAGED)


def _staged(objects: MemoryObjects, store: MemoryStore) -> tuple[Manifest, Layout]:
    entries = [Entry(f"f{i}", 100, f"{i:064x}", False, "zlib" if i else "") for i in range(3)]
    manifest = Manifest.build("/data/set", entries)
    layout = Layout("sb/", namespace("phys"))
    for e in entries:
        objects.write_bytes(layout.object(e.object_name()), b"x" * 100)
    objects.write_bytes(layout.manifest(manifest.id), manifest.body)
    objects.write_bytes(layout.pointer("/data/set"), pointer_body("/data/set", manifest, 0))
    store.add_stage(StageRecord(
        owner=OWNER, burst_only=True, stages=[{"src": "/data/set", "dst": "set"}],
        state=StageState.STAGED, created_at=1.0, updated_at=1.0,
        datasets=[{"dst": "set", "src": "/data/set", "manifest": manifest.id}],
    ))  # fmt: skip
    store.transition("gpu-01", NodeState.REQUESTED, time.time(), group="gpu",
                     provider="aws", jobs='[{"job_id": 42, "nodes": "gpu-01"}]')  # fmt: skip
    return manifest, layout


def _staging(
    objects: MemoryObjects, store: MemoryStore, led: FakeLedger, said: Said, clock: Fixed
) -> NodeStaging:
    stager = Stager(settings=StagingSettings(prefix="sb/"), store=objects, tree=None,  # type: ignore[arg-type]
                    clock=clock)  # fmt: skip
    book = TransferBook("c", PRICES, clock, led, said)  # type: ignore[arg-type]
    return NodeStaging(NodeStagingSettings(node_dir="/var/lib/sb/stage"), store, stager,
                       clock, connector=None, book=book)  # type: ignore[arg-type]  # fmt: skip


def test_a_nodes_pull_is_in_the_ledger_at_the_download_price() -> None:
    objects, store, led, said, clock = MemoryObjects(), MemoryStore(), FakeLedger(), Said(), Fixed()
    manifest, _ = _staged(objects, store)
    staging = _staging(objects, store, led, said, clock)
    sh = Shell({"ok": True, "exit": 0, "files": 3, "bytes": 300, "fetched_bytes": 250,
                "seconds": 0.4})  # fmt: skip
    node = store.node("gpu-01")
    assert node is not None
    assert staging.pull(sh, node, clock.t + 30, lambda: None) == 250
    [t] = led.moved.values()
    assert (t.direction, t.node, t.provider, t.job_id, t.manifest, t.bytes_sent) == (
        "pull", "gpu-01", "aws", 42, manifest.id, 250)  # fmt: skip
    assert t.cost_micros == round(250 * 20_000 / GB) and said.calls == [
        ("pull", "s3-lab", True, 250)
    ]
    assert "--exit-zero" in sh.ran[-1]  # the answer is read whole, whatever the exit


CORRUPT = {"ok": False, "exit": 1, "error": "f0: not fetched whole in 4 tries",
           "fetched_bytes": 800}  # fmt: skip


def test_objects_bad_in_the_store_are_dropped_pushed_again_and_pulled_on_the_same_node() -> None:
    """Every fetch of two objects came back wrong: the store loses those objects and the
    dataset's pointer (so the push does not find it unchanged), the stage goes back to
    the daemon's push, and once it is stored again the node pulls once more. The job
    never waits on a requeue (Slurm strands a requeued burst-buffer job: docs/staging.md)."""
    objects, store, led, said = MemoryObjects(), MemoryStore(), FakeLedger(), Said()
    clock = Pushing(store)
    manifest, layout = _staged(objects, store)
    staging = _staging(objects, store, led, said, clock)
    bad = [e.sha256 for e in manifest.entries[:2]]
    sh = Shell({**CORRUPT, "corrupt": bad}, {"ok": True, "exit": 0, "files": 3, "bytes": 300,
                                            "fetched_bytes": 200, "kept": 1})  # fmt: skip
    node = store.node("gpu-01")
    assert node is not None
    assert staging.pull(sh, node, clock.t + 30, lambda: None) == 200
    left = {e.sha256 for e in manifest.entries if layout.object(e.object_name()) in objects.objects}
    assert left == {manifest.entries[2].sha256}  # the push that follows sends them again
    assert layout.pointer("/data/set") not in objects.objects
    assert layout.manifest(manifest.id) in objects.objects
    assert clock.seen[0] == StageState.PUSHING and len(sh.ran) == 2
    # the first pull kept half the time left for the push again and the second pull
    first, second = (float(argv[argv.index("--deadline") + 1]) for argv in sh.ran)
    assert first <= 13 and second >= 20, sh.ran
    assert [t.bytes_sent for t in led.moved.values()] == [200]
    assert said.calls == [("pull", "s3-lab", False, 0), ("pull", "s3-lab", True, 200)]


def test_objects_bad_again_after_they_were_sent_again_fail_the_join() -> None:
    objects, store, led, said = MemoryObjects(), MemoryStore(), FakeLedger(), Said()
    clock = Pushing(store)
    manifest, _ = _staged(objects, store)
    staging = _staging(objects, store, led, said, clock)
    bad = [manifest.entries[0].sha256]
    sh = Shell({**CORRUPT, "corrupt": bad}, {**CORRUPT, "corrupt": bad})
    node = store.node("gpu-01")
    assert node is not None
    with pytest.raises(StepError, match="not fetched whole") as failed:
        staging.pull(sh, node, clock.t + 30, lambda: None)
    assert failed.value.code == "StagePull" and len(sh.ran) == 2 and led.moved == {}
    assert clock.seen == [StageState.PUSHING]  # dropped and pushed again once, not twice


def test_a_second_node_of_the_job_finding_the_same_bad_copy_waits_for_the_same_push() -> None:
    objects, store, led, said = MemoryObjects(), MemoryStore(), FakeLedger(), Said()
    clock = Pushing(store)
    manifest, _ = _staged(objects, store)
    staging = _staging(objects, store, led, said, clock)

    class Meanwhile(Shell):
        def run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
            if not self.ran:  # while this node pulls, the job's other node drops the copy
                store.update_stage(42, clock.t, state=StageState.PUSHING)
            return super().run(argv, timeout)

    sh = Meanwhile(
        {**CORRUPT, "corrupt": [manifest.entries[0].sha256]},
        {"ok": True, "exit": 0, "files": 3, "bytes": 300, "fetched_bytes": 100},
    )
    node = store.node("gpu-01")
    assert node is not None
    assert staging.pull(sh, node, clock.t + 30, lambda: None) == 100
    assert clock.seen == [StageState.PUSHING] and len(sh.ran) == 2


def test_a_pull_that_failed_on_the_way_drops_nothing() -> None:
    objects, store, led, said, clock = MemoryObjects(), MemoryStore(), FakeLedger(), Said(), Fixed()
    _staged(objects, store)
    before = dict(objects.objects)
    staging = _staging(objects, store, led, said, clock)
    sh = Shell({"ok": False, "exit": 3, "error": "/var/lib: 5 bytes free"})
    node = store.node("gpu-01")
    assert node is not None
    with pytest.raises(StepError, match="bytes free"):
        staging.pull(sh, node, clock.t + 30, lambda: None)
    assert objects.objects == before and store.stage(42).state == StageState.STAGED  # type: ignore[union-attr]


# -- storage: GB-months, booked by stage gc ----------------------------------------------


def test_byte_seconds_count_each_key_from_its_write_or_the_last_booking() -> None:
    keys = [(GB, 1000.0), (10, 5000.0), (0, 0.0), (7, 9000.0)]  # the last: after now
    assert stored_byte_seconds(keys, None, 6000.0) == GB * 5000 + 10 * 1000
    assert stored_byte_seconds(keys, 4000.0, 6000.0) == GB * 2000 + 10 * 1000
    assert stored_byte_seconds(keys, 7000.0, 6000.0) == 0  # a clock gone back books nothing
    # booked in two runs or in one: the same byte-seconds (whole seconds either way)
    assert (stored_byte_seconds(keys, None, 5500.0) + stored_byte_seconds(keys, 5500.0, 6000.0)
            == stored_byte_seconds(keys, None, 6000.0))  # fmt: skip


@pytest.mark.parametrize(
    ("byte_seconds", "per_month", "micros"),
    [(GB * MONTH_SECONDS, 0.023, 23_000), (GB * MONTH_SECONDS // 2, 0.023, 11_500),
     (1024 * GB * MONTH_SECONDS, 0.02, 20_480_000), (GB * 3600, 0.023, 32), (0, 1.0, 0),
     (-5, 1.0, 0)],
    ids=["GB-month", "half", "TB-month", "GB-hour", "nothing", "negative"],
)  # fmt: skip
def test_storage_costs_gb_months_of_730_hours_to_the_micro_dollar(
    byte_seconds: int, per_month: float, micros: int
) -> None:
    assert storage_cost_micros(byte_seconds, round(per_month * 1_000_000)) == micros


class Bookings:
    """The StorageLedger port in memory: a booking's key once, the latest end by store."""

    def __init__(self) -> None:
        self.rows: dict[str, Any] = {}

    def storage_booked(self, store: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.rows.values():
            if r.store == store:
                out[r.namespace] = max(out.get(r.namespace, 0.0), r.at)
        return out

    def storage(self, s: Any) -> None:
        self.rows.setdefault(s.key, s)


def test_storage_is_charged_to_the_namespaces_account_once_a_period() -> None:
    led = Bookings()
    book = StorageBook("c", PRICES, led)
    held = {"acct-phys": Held(3, GB, GB * MONTH_SECONDS, None),
            "scratch": Held(1, 10, 0, None)}  # fmt: skip
    charges = book.charges(held, 1_790_000_000.0)
    assert [(c.account, c.namespace, c.cost_micros, c.gb_months) for c in charges] == [
        ("phys", "acct-phys", 250_000, 1.0), ("", "scratch", 0, 0.0)]  # fmt: skip
    book.book(charges)
    book.book(book.charges(held, 1_790_000_500.0))  # read the same last booking: nothing
    assert len(led.rows) == 2 and book.booked() == {"acct-phys": 1_790_000_000.0,
                                                    "scratch": 1_790_000_000.0}  # fmt: skip
    later = book.charges({"acct-phys": Held(3, GB, GB * 3600, 1_790_000_000.0)}, 1_790_003_600.0)
    book.book(later)
    assert later[0].cost_micros == 342 and later[0].start == 1_790_000_000.0  # 0.25/730
    assert book.booked()["acct-phys"] == 1_790_003_600.0
    assert later[0].as_dict()["gb_months"] == round(3600 / MONTH_SECONDS, 6)
