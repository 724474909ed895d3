"""A cloud node's pull of its jobs' staged data: a step of its join, before slurmd starts.

The jobs Slurm resumed the node for (the resume file's, as stored on the node) that
have a stage are waited for until the daemon has stored their data (a job that may run
on-prem is pushed only now: ``services/stagework.py``), then each dataset is pulled by
``node/stagein.py`` on the node, as root over SSH: read-only URLs valid
``grant_seconds``, every file verified (SHA-256) under a temporary name, the dataset
renamed into place whole, read-only and the job user's. A stage that failed or was kept
home, a pull that fails, or a wait past the join's deadline fails the node's join: the
job is requeued onto a new node (the PrologSlurmctld sees the failure), and the node's
reason names the cause.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from slurm_burst.core.errors import BurstError, StepError
from slurm_burst.core.jobs import job_ids
from slurm_burst.core.records import NodeRecord, StageRecord, StageState
from slurm_burst.core.remote import RemoteError
from slurm_burst.ports import Clock, NodeStore, RemoteShell
from slurm_burst.services.staging import Stager

log = logging.getLogger(__name__)

REMOTE_PULLER = "/run/slurm-burst-stagein.py"
POLL = 0.5


@dataclass(frozen=True)
class NodeStagingSettings:
    node_dir: str  # staging.node_dir
    node_python: str = "python3"  # any Python 3 on the node: the puller is stdlib only


class NodeStaging:
    def __init__(
        self, settings: NodeStagingSettings, store: NodeStore, stager: Stager, clock: Clock
    ) -> None:
        self.settings = settings
        self.store = store
        self.stager = stager
        self.clock = clock
        self.puller = resources.files("slurm_burst.node").joinpath("stagein.py").read_bytes()

    def pull(
        self, sh: RemoteShell, node: NodeRecord, deadline: float, check: Callable[[], None]
    ) -> int:
        """Pull every staged dataset of ``node``'s jobs onto it; the bytes fetched.
        ``deadline`` is on the clock's monotonic time; ``check`` raises if the node is no
        longer wanted."""
        stages = [s for j in sorted(job_ids(node.job_list())) if (s := self.store.stage(j))]
        if not stages:
            return 0
        sh.put(self.puller, REMOTE_PULLER, 0o700)
        fetched = 0
        for st in stages:
            st = self._stored(st, deadline, check)
            for d in st.datasets:
                fetched += self._pull(sh, node, st, d, deadline)
        return fetched

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
            again = self.store.stage(st.job_id)
            if again is None:
                raise StepError("StageFailed", f"job {st.job_id}'s stage record vanished")
            st = again

    def _pull(
        self, sh: RemoteShell, node: NodeRecord, st: StageRecord, d: dict[str, object],
        deadline: float,
    ) -> int:  # fmt: skip
        dst = str(d["dst"])
        dest = f"{self.settings.node_dir}/{st.job_id}/{dst}"
        try:
            manifest = self.stager.manifest_of(st.account, str(d["manifest"]))
            plan = self.stager.node_plan(st.account, manifest, dest, st.uid, st.gid)
        except BurstError as exc:
            raise StepError("StagePull", f"job {st.job_id} {dst}: {exc}") from exc
        path = f"/run/slurm-burst-plan-{st.job_id}-{dst}.json"
        sh.put(json.dumps(plan).encode(), path, 0o600)  # its URLs are grants: root's only
        timeout = max(5.0, deadline - self.clock.monotonic())
        try:
            said = sh.run([self.settings.node_python, REMOTE_PULLER, "--plan", path], timeout)
        except RemoteError as exc:
            raise StepError("StagePull", f"job {st.job_id} {dst} -> {node.name}: {exc}") from exc
        try:
            out = json.loads(said.strip().splitlines()[-1])
        except (ValueError, IndexError):
            out = {}
        got = int(out.get("fetched_bytes", 0) or 0)
        log.info(
            "stage.pulled node=%s job=%s dst=%s files=%s fetched_bytes=%d refetched=%s",
            node.name, st.job_id, dst, out.get("files"), got, out.get("refetched", 0),
        )  # fmt: skip
        return got
