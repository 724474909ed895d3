"""A cloud node's pull of its jobs' staged data: a step of its join, before slurmd starts.

The jobs Slurm resumed the node for (the resume file's, as stored on the node) that
have a stage are waited for until the daemon has stored their data (a job that may run
on-prem is pushed only now: ``services/stagework.py``), then each dataset is pulled by
``node/stagein.py`` on the node, as root over SSH: read-only URLs valid
``grant_seconds``, every file verified (SHA-256) under a temporary name, the dataset
renamed into place whole, read-only and the job user's. An object that comes back wrong
on every fetch is bad in the store: it is dropped, the stage pushed again, and the node
pulls once more (the job waits; Slurm requeues a burst-buffer job badly, see
docs/staging.md). A stage that failed or was kept home, a pull that fails otherwise, or
a wait past the join's deadline fails the node's join: the job is requeued (the
PrologSlurmctld sees the failure), and the node's reason names the cause.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from slurm_burst.core.errors import BurstError, StepError
from slurm_burst.core.jobs import job_ids
from slurm_burst.core.jsonread import read_json
from slurm_burst.core.numbers import json_count
from slurm_burst.core.records import NodeRecord, StageRecord, StageState
from slurm_burst.core.remote import RemoteError
from slurm_burst.core.staging import Manifest, output_dir
from slurm_burst.core.usage import TransferDirection
from slurm_burst.ports import Clock, Connector, NodeStore, RemoteShell
from slurm_burst.services.staging import Stager
from slurm_burst.services.transfers import TransferBook

log = logging.getLogger(__name__)

REMOTE_PULLER = "/run/slurm-burst-stagein.py"
REMOTE_OUTPUTS = "/run/slurm-burst-stageout.py"
POLL = 0.5
ASKED_WAIT = 600.0  # seconds a pull the prolog asked for may take
FETCH_STALL = 10  # seconds without a byte after which a fetch has failed


@dataclass(frozen=True)
class NodeStagingSettings:
    node_dir: str  # staging.node_dir
    node_python: str = "python3"  # any Python 3 on the node: the puller is stdlib only


class NodeStaging:
    def __init__(
        self,
        settings: NodeStagingSettings,
        store: NodeStore,
        stager: Stager,
        clock: Clock,
        connector: Connector,
        book: TransferBook | None = None,
    ) -> None:
        self.settings = settings
        self.book = book  # each pull into the ledger and the metrics
        self.store = store
        self.stager = stager
        self.clock = clock
        self.connector = connector
        node_files = resources.files("slurm_burst.node")
        self.puller = node_files.joinpath("stagein.py").read_bytes()
        self.stageout = node_files.joinpath("stageout.py").read_bytes()

    def pull(
        self, sh: RemoteShell, node: NodeRecord, deadline: float, check: Callable[[], None]
    ) -> int:
        """Pull every staged dataset of ``node``'s jobs onto it; the bytes fetched.
        ``deadline`` is on the clock's monotonic time; ``check`` raises if the node is no
        longer wanted."""
        stages = [s for j in sorted(job_ids(node.job_list())) if (s := self.store.stage(j))]
        return self._pull_stages(sh, node, stages, deadline, check)

    def pull_asked(self, job_id: int, name: str) -> None:
        """A pull the PrologSlurmctld asked for: job ``job_id`` landed on ``name``, a node
        that had joined before (for another job, or warm). The answer is in the state
        database (``pulled`` or ``pull_failure``), and the ask is removed."""
        failure = ""
        try:
            node = self.store.node(name)
            st = self.store.stage(job_id)
            if node is None or st is None or not node.ip:
                raise StepError("StagePull", f"{name} or job {job_id}'s stage is not known")
            deadline = self.clock.monotonic() + ASKED_WAIT
            sh = self.connector.connect(node.ip, node.host_key_list(), deadline)
            try:
                self._pull_stages(sh, node, [st], deadline, lambda: None)
            finally:
                sh.close()
        except BurstError as exc:
            log.error("stage.pull_failed node=%s job=%s code=%s %s", name, job_id, exc.code, exc)
            failure = f"{exc.code}: {exc}"[:900]
        self.store.pull_done(job_id, name, failure)

    def _pull_stages(
        self, sh: RemoteShell, node: NodeRecord, stages: list[StageRecord], deadline: float,
        check: Callable[[], None],
    ) -> int:  # fmt: skip
        if not stages:
            return 0
        self.put_puller(sh)
        fetched = 0
        for st in stages:
            st = self._stored(st, deadline, check)
            got = 0
            for d in st.datasets:
                try:
                    got += self._pull(sh, node, st, d, deadline, heal=True)
                except _Dropped:  # bad in the store, dropped, pushed again: once more
                    st = self._stored(self._again(st), deadline, check)
                    again = [x for x in st.datasets if x.get("dst") == d["dst"]]
                    if not again:
                        raise StepError("StagePull", f"job {st.job_id}: {d['dst']} gone") from None
                    got += self._pull(sh, node, st, again[0], deadline, heal=False)
            got += self._outputs(sh, node, st, deadline)
            self.store.pulled(st.job_id, node.name, self.clock.now(), got)
            fetched += got
        return fetched

    def _outputs(self, sh: RemoteShell, node: NodeRecord, st: StageRecord, deadline: float) -> int:
        """The job's output directories (``stage_out``), the user's to write: empty, or
        holding the last version synced, for a requeued job to resume from. A version
        that cannot be brought back is said (event, log, the output's record) and the job
        starts from an empty directory: it loses the time since its start, not data
        (the version stays in the store)."""
        outs = self.store.outputs(st.job_id)
        if not outs:
            return 0
        sh.put(self.stageout, REMOTE_OUTPUTS, 0o700)
        who = st.owner
        got = 0
        for r in outs:
            dest = output_dir(self.settings.node_dir, st.job_id, r.name)
            if r.manifest:
                try:
                    got += self._pull(sh, node, st, {"dst": r.name, "manifest": r.manifest},
                                      deadline, writable=True)  # fmt: skip
                    log.info("output.restored node=%s job=%s name=%s files=%d", node.name,
                             st.job_id, r.name, r.files)  # fmt: skip
                    continue
                except BurstError as exc:
                    why = f"the version to resume from was not brought back: {exc.code}: {exc}"
                    log.error("output.not_restored node=%s job=%s name=%s %s", node.name,
                              st.job_id, r.name, why)  # fmt: skip
                    self.store.event(self.clock.now(), "output.not_restored", node.name,
                                     f"job {st.job_id} {r.name}: {why}"[:900])  # fmt: skip
            argv = [self.settings.node_python, REMOTE_OUTPUTS, "prepare", "--dir", dest,
                    "--uid", str(who.uid), "--gid", str(who.gid)]  # fmt: skip
            try:
                sh.run(argv, max(5.0, deadline - self.clock.monotonic()))
            except RemoteError as exc:
                raise StepError("StagePull", f"job {st.job_id} output {r.name}: {exc}") from exc
        return got

    def _stored(self, st: StageRecord, deadline: float, check: Callable[[], None]) -> StageRecord:
        while True:
            if st.state == StageState.STAGED:
                return st
            if st.state == StageState.KEPT_HOME:
                raise StepError("StageKeptHome", f"job {st.job_id}: {st.message}")
            if st.state == StageState.FAILED:
                raise StepError("StageFailed", f"job {st.job_id}: {st.message}")
            if self.clock.monotonic() > deadline:
                raise StepError(
                    "StageTimeout", f"job {st.job_id}'s data not stored in time ({st.state})"
                )
            check()
            self.clock.sleep(POLL)
            st = self._again(st)

    def _again(self, st: StageRecord) -> StageRecord:
        """``st`` as the state database holds it now."""
        rec = self.store.stage(st.job_id)
        if rec is None:
            raise StepError("StageFailed", f"job {st.job_id}'s stage record vanished")
        return rec

    def _pull(
        self, sh: RemoteShell, node: NodeRecord, st: StageRecord, d: dict[str, object],
        deadline: float, heal: bool = False, writable: bool = False,
    ) -> int:  # fmt: skip
        dst = str(d["dst"])
        dest = f"{self.settings.node_dir}/{st.job_id}/{dst}"
        try:
            who = st.owner
            manifest = self.stager.manifest_of(who.account, str(d["manifest"]))
            plan = self.stager.node_plan(
                who.account, manifest, dest, who.uid, who.gid, writable=writable
            )
        except BurstError as exc:
            raise StepError("StagePull", f"job {st.job_id} {dst}: {exc}") from exc
        out: dict[str, Any] = {}
        try:
            out = self.run_plan(sh, plan, f"{st.job_id}-{dst}", deadline, heal)
        except RemoteError as exc:
            out = exc.answer if isinstance(exc, PullFailed) else {}
            if self.book is not None:
                self.book.failed(TransferDirection.PULL)
            bad = [x for x in out.get("corrupt", []) if isinstance(x, str)]
            if bad and heal and exc.code == "RemoteCommand" and self._drop(st, d, manifest, bad):
                raise _Dropped from exc
            raise StepError("StagePull", f"job {st.job_id} {dst} -> {node.name}: {exc}") from exc
        got = json_count(out.get("fetched_bytes"))
        if self.book is not None:
            self.book.pulled(
                out, account=st.owner.account, user=st.owner.user, job_id=st.job_id, dst=dst,
                node=node.name, provider=node.provider, manifest=manifest.id,
                stage_id=str(st.created_at),
            )  # fmt: skip
        log.info(
            "stage.pulled node=%s job=%s dst=%s files=%s fetched_bytes=%d refetched=%s",
            node.name, st.job_id, dst, out.get("files"), got, out.get("refetched", 0),
        )  # fmt: skip
        return got

    def put_puller(self, sh: RemoteShell) -> None:
        sh.put(self.puller, REMOTE_PULLER, 0o700)

    def run_plan(
        self, sh: RemoteShell, plan: dict[str, Any], label: str, deadline: float,
        heal: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """``plan`` fetched by the node's puller (:meth:`put_puller` first, once per
        session); its answer. A failed pull raises RemoteError, with the puller's answer
        (which objects were bad) as ``answer``."""
        path = f"/run/slurm-burst-plan-{label}.json"
        sh.put(json.dumps(plan).encode(), path, 0o600)  # its URLs are grants: root's only
        timeout = max(5.0, deadline - self.clock.monotonic())
        # a fetch with no data for FETCH_STALL s is a failed one; the puller stops starting
        # fetches before SSH gives up on it, so its answer (which objects were bad) comes;
        # a first pull keeps half the time for a push again and a second pull
        left = timeout - 5
        until = f"{max(1.0, left / 2 if heal else left):.0f}"
        argv = [self.settings.node_python, REMOTE_PULLER, "--plan", path, "--exit-zero",
                "--timeout", str(FETCH_STALL), "--deadline", until]  # fmt: skip
        out = _answer(sh.run(argv, timeout))
        if out.get("exit") != 0:
            raise PullFailed(str(out.get("error", "no answer"))[:500], out)
        return out

    def _drop(self, st: StageRecord, d: dict[str, object], manifest: Manifest,
              bad: list[str]) -> bool:  # fmt: skip
        """Objects whose every fetch came back wrong are bad in the store: drop them (and
        the dataset's pointer, so a push does not take it as unchanged) and push the
        stage again (the daemon's stage work, as the job's user); the node then pulls
        once more, keeping what it had verified. True if the stage is pushed again."""
        try:
            n = self.stager.drop(st.owner.account, str(d.get("src", "")), manifest, bad)
            again = self.store.update_stage(
                st.job_id, self.clock.now(), expect=[StageState.STAGED], state=StageState.PUSHING,
                message=f"{n} objects were corrupt in the store: pushing again",
            ) or (  # another node of the job found them first: its push serves this one
                (now := self.store.stage(st.job_id)) is not None
                and now.state == StageState.PUSHING
            )  # fmt: skip
        except BurstError as exc:
            log.error("stage.corrupt_not_dropped job=%s error=%s", st.job_id, exc)
            return False
        log.error("stage.corrupt_in_store job=%s objects=%d pushing_again=%s",
                  st.job_id, n, again)  # fmt: skip
        return again


class PullFailed(RemoteError):
    """The puller ran and failed; ``answer`` is what it said (its corrupt objects)."""

    def __init__(self, message: str, answer: dict[str, Any]) -> None:
        super().__init__(message, "RemoteCommand")
        self.answer = answer


class _Dropped(BurstError):
    """A pull found objects bad in the store, which were dropped and are pushed again
    (caught here: the node pulls once more; it never reaches a user)."""

    code = "StagePull"


def _answer(said: str) -> dict[str, Any]:
    """The puller's one JSON line (its last), or {} if it said something else."""
    try:
        out = read_json(said.strip().splitlines()[-1], "the stage-in pull's answer")
    except (ValueError, IndexError):
        return {}
    return out if isinstance(out, dict) else {}
