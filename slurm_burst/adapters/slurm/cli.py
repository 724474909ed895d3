"""The Slurm CLI backend: read with sinfo/squeue --json, write with scontrol update.

Each read is one command (the reconcile loop's budget is a few Slurm calls per
pass). Updates go in batches of at most ``batch`` nodes: a hostlist argument
keeps the command short, and when scontrol rejects one node of a batch
(``Invalid node name``) it may already have applied the change to the nodes
before it, so callers treat a failed batch as "state unknown, re-read".
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from slurm_burst.adapters.proc import CommandError, Result, run
from slurm_burst.adapters.slurm.openapi import SchemaError, parse_jobs, parse_nodes, slurm_release
from slurm_burst.core.hostlist import compress
from slurm_burst.core.slurm import (
    OWNER_FORMAT,
    QUEUE_FORMAT,
    JobOwner,
    QueuedJob,
    SchedulerError,
    SlurmJob,
    SlurmNode,
    SlurmPartition,
    check_names,
    check_update,
    parse_job_gpus,
    parse_job_owner,
    parse_queue,
    parse_state_field,
)
from slurm_burst.core.slurmsyntax import word

log = logging.getLogger(__name__)

Runner = Callable[..., Result]
STEER_BATCH = 1000  # job ids per scontrol update (about 8 KB of argv)


class SlurmError(SchedulerError):
    """A Slurm command failed; ``message`` is Slurm's own words."""

    def __init__(self, command: str, message: str) -> None:
        self.command = command
        self.message = message
        super().__init__(f"{command}: {message}")


class SlurmCli:
    """Scheduler port over Slurm's command-line tools."""

    def __init__(
        self,
        bin_dir: str = "/usr/bin",
        slurm_conf: str | None = None,
        timeout: float = 30.0,
        batch: int = 100,
        runner: Runner = run,
    ) -> None:
        if not 1 <= batch <= 100:
            raise ValueError("batch must be between 1 and 100")
        self.bin = Path(bin_dir)
        self.env = {"SLURM_CONF": slurm_conf} if slurm_conf else None
        self.timeout = timeout
        self.batch = batch
        self._run = runner
        self._nodes_from_scontrol = False  # learned from the first sinfo --json
        self._queue_lines: dict[str, QueuedJob] = {}  # the last squeue read, line -> job

    def _cmd(self, tool: str, *args: str, env: dict[str, str] | None = None) -> str:
        argv = [str(self.bin / tool), *args]
        try:
            return self._run(
                argv, timeout=self.timeout, env={**(self.env or {}), **env} if env else self.env
            ).stdout
        except CommandError as exc:
            raise SlurmError(f"{tool} {' '.join(args[:2])}", exc.stderr or exc.reason) from exc

    def _json(self, tool: str, *args: str) -> dict[str, object]:
        text = self._cmd(tool, *args)
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise SchemaError(f"{tool} --json did not print JSON: {exc}") from exc
        for err in doc.get("errors") or []:
            raise SlurmError(
                tool, str(err.get("description") or err) if isinstance(err, dict) else str(err)
            )
        return dict(doc)

    # -- reads --------------------------------------------------------------
    def nodes(self) -> list[SlurmNode]:
        """Every node, one command. 22.05's ``sinfo --json`` lists nodes; later releases
        group them by state there, so their per-node records come from ``scontrol show
        nodes --json``: the first read learns which from sinfo's answer, later reads go
        straight to the right command."""
        if self._nodes_from_scontrol:
            return parse_nodes(self._json("scontrol", "show", "nodes", "--json"))
        doc = self._json("sinfo", "--json")
        if "nodes" in doc or "sinfo" not in doc:
            return parse_nodes(doc)
        self._nodes_from_scontrol = True
        log.info("slurm.nodes_from_scontrol release=%s", slurm_release(doc) or "unknown")
        return parse_nodes(self._json("scontrol", "show", "nodes", "--json"))

    def registered(self, names: Sequence[str]) -> set[str]:
        """Which of ``names`` slurmctld has heard from since they were powered up: one
        ``scontrol show node -o HOSTLIST`` (slurmctld sends every node once and scontrol
        picks; the text format is the same from 22.05 to 26.05). What the daemon polls
        while nodes join, so that the PrologSlurmctld can let their jobs start."""
        if not names:
            return set()
        text = self._cmd("scontrol", "show", "node", "--oneliner", compress(list(names)))
        return {name for name, node in parse_oneliners(text).items() if node.registered}

    def jobs(self, partitions: Sequence[str] | None = None) -> list[SlurmJob]:
        """Jobs, all or of ``partitions`` only (the reconcile loop reads burst partitions)."""
        args = ["--json"] + ([f"--partition={','.join(partitions)}"] if partitions else [])
        return parse_jobs(self._json("squeue", *args))

    def job_counts(self, partitions: Sequence[str] | None = None) -> dict[tuple[str, str], int]:
        """How many jobs of ``partitions`` are in each state: {(partition, state): n}.

        One ``squeue`` call with a two-field format, counted in C: the reconcile
        loop reads this every pass. ``squeue --json`` of 100,000 queued jobs is
        about 50 MB (far more on a real 22.05 controller, ~100 fields per job)
        and parsing it would dominate the pass's CPU and memory.
        """
        args = ["--noheader", "--array", "--format=%P|%T"]
        if partitions:
            args.append(f"--partition={','.join(partitions)}")
        out = {}
        for line, n in Counter(self._cmd("squeue", *args).splitlines()).items():
            part, sep, state = line.partition("|")
            if not sep:
                raise SchemaError(f"squeue --format line not understood: {line[:200]!r}")
            out[(part, state)] = n
        return out

    def job_gpus(self, job_ids: Sequence[int]) -> dict[int, dict[str, tuple[int, ...]]]:
        """The GPU indices each job holds on each of its nodes (``scontrol -d show job``,
        one call per job: callers ask once per job, when it starts). A job that is gone
        is left out."""
        out = {}
        for job_id in job_ids:
            try:
                text = self._cmd("scontrol", "-d", "--oneliner", "show", "job", str(int(job_id)))
            except SlurmError as exc:
                if "Invalid job id" in exc.message:
                    continue
                raise
            try:
                out[job_id] = {n: idx for n, idx in parse_job_gpus(text).items()}
            except ValueError as exc:
                raise SchemaError(f"scontrol show job {job_id}: {exc}") from exc
        return out

    def partitions(self) -> list[SlurmPartition]:
        out = []
        for line in self._cmd("scontrol", "show", "partition", "--oneliner").splitlines():
            fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            if "PartitionName" not in fields:
                continue
            out.append(
                SlurmPartition(
                    name=fields["PartitionName"],
                    nodes=fields.get("Nodes", ""),
                    state=fields.get("State", ""),
                    max_time=fields.get("MaxTime", ""),
                    default=fields.get("Default") == "YES",
                    total_nodes=int(fields.get("TotalNodes", "0") or 0),
                    suspend_time=fields.get("SuspendTime", ""),
                )
            )
        return out

    def pending_jobs(self) -> list[QueuedJob]:
        """Every pending job, one ``squeue`` call (the burst policy's read)."""
        text = self._cmd(
            "squeue", "--noheader", "--states=PD", f"--Format={QUEUE_FORMAT}",
            env={"SLURM_TIME_FORMAT": "%s"},
        )  # fmt: skip
        try:
            return parse_queue(text, self._queue_lines)
        except ValueError as exc:
            raise SchemaError(f"squeue --Format: {exc}") from exc

    def job_owner(self, job_id: int) -> JobOwner:
        """Whose job ``job_id`` is, its account, QOS and partitions (one ``squeue``)."""
        text = self._cmd(
            "squeue", "--noheader", f"--jobs={int(job_id)}", f"--format={OWNER_FORMAT}"
        )
        try:
            return parse_job_owner(text, int(job_id))
        except ValueError as exc:
            raise SchemaError(f"squeue --jobs={job_id}: {exc}") from exc

    def steer_jobs(
        self, job_ids: Sequence[str], partitions: Sequence[str], comment: str
    ) -> list[str]:
        """Set the partition list and AdminComment of pending jobs: ``scontrol update
        JobId=1,2,3 Partition=... AdminComment=...``, up to 1,000 jobs a call. A job that
        started or left since it was read makes scontrol complain (and exit 1) while the
        others are updated: Slurm's complaints are returned, not raised."""
        complaints: list[str] = []
        for start in range(0, len(job_ids), STEER_BATCH):
            chunk = job_ids[start : start + STEER_BATCH]
            argv = [
                str(self.bin / "scontrol"), "update", f"JobId={','.join(chunk)}",
                f"Partition={','.join(partitions)}", f"AdminComment={comment}",
            ]  # fmt: skip
            try:
                res = self._run(argv, timeout=self.timeout, env=self.env, check=False)
            except CommandError as exc:  # not run, or timed out: the next pass reads again
                raise SlurmError("scontrol update", exc.stderr or exc.reason) from exc
            if res.returncode != 0:
                complaints.extend(
                    line.strip() for line in (res.stderr or res.stdout).splitlines() if line.strip()
                )
            log.info("slurm.steer jobs=%d partitions=%s rc=%d", len(chunk), ",".join(partitions),
                     res.returncode)  # fmt: skip
        return complaints

    # -- what is done to a job whose node is to be reclaimed -------------------
    def jobs_on(self, node: str, states: str = "RUNNING") -> list[int]:
        """The jobs on ``node`` in ``states``: one ``squeue --nodelist`` of ids only
        (fast: the whole queue's JSON takes a second on a busy controller)."""
        out = self._cmd("squeue", "--noheader", f"--nodelist={node}", f"--states={states}",
                        "--format=%i")  # fmt: skip
        return sorted(int(w) for w in out.split() if w.isascii() and w.isdigit())

    def batch_script(self, job_id: int) -> str:
        """The job's batch script (``scontrol write batch_script ID -``); '' for a job
        without one (an allocation by salloc or srun)."""
        try:
            return self._cmd("scontrol", "write", "batch_script", str(int(job_id)), "-")
        except SlurmError as exc:
            if "no batch script" in str(exc).lower() or "not a batch job" in str(exc).lower():
                return ""
            raise

    def signal_job(self, job_id: int, signal: str, batch_only: bool) -> None:
        """``scancel --signal=SIG [--batch] ID``: its steps, or with ``batch_only`` its
        batch shell, get ``signal`` (a name or number; the job goes on)."""
        if not (signal.isascii() and signal.isalnum()):
            raise ValueError(f"signal {signal[:20]!r}: a name or a number")
        args = [f"--signal={signal}", *(["--batch"] if batch_only else []), str(int(job_id))]
        self._cmd("scancel", *args)

    def requeue(self, job_ids: Sequence[int]) -> None:
        """``scontrol requeue ID,...``: back to pending, to run again (SIGTERM now,
        SIGKILL after KillWait)."""
        if job_ids:
            self._cmd("scontrol", "requeue", ",".join(str(int(j)) for j in job_ids))

    def ping(self) -> bool:
        try:
            return " is UP" in self._cmd("scontrol", "ping")
        except SlurmError:
            return False

    # -- writes -------------------------------------------------------------
    def update_nodes(
        self,
        names: Sequence[str],
        *,
        state: str | None = None,
        reason: str | None = None,
        addrs: Sequence[str] | None = None,
        hostnames: Sequence[str] | None = None,
        comment: str | None = None,
        instance: tuple[str, str, str] | None = None,
    ) -> None:
        """``scontrol update nodename=...`` for ``names`` in batches.

        ``addrs``/``hostnames``, when given, pair one-to-one with ``names``.
        The reason, the comment and an instance's Extra are one argv element each:
        quotes or spaces in them are data. (A reason is kept only with a DOWN or DRAIN
        state; the comment, which Slurm shows in ``scontrol show node`` whatever the
        state, says what a node that is up should tell.)
        """
        check_update(names, state, reason, addrs, hostnames, comment, instance)
        for start in range(0, len(names), self.batch):
            chunk = list(names[start : start + self.batch])
            args = ["update", f"nodename={compress(chunk)}"]
            if addrs is not None:
                args.append("nodeaddr=" + ",".join(addrs[start : start + self.batch]))
            if hostnames is not None:
                args.append("nodehostname=" + ",".join(hostnames[start : start + self.batch]))
            if state is not None:
                args.append(f"state={state}")
            if reason is not None:
                args.append(f"reason={reason}")
            if comment is not None:
                args.append(f"comment={comment}")
            if instance is not None:  # 23.11+ (InstanceId, InstanceType, Extra)
                iid, kind, extra = instance
                args += [f"instanceid={iid}", f"instancetype={kind}", f"extra={extra}"]
            log.info(
                "slurm.update nodes=%d hostlist=%s state=%s", len(chunk), compress(chunk), state
            )
            self._cmd("scontrol", *args)

    def create_nodes(self, names: Sequence[str], settings: Sequence[tuple[str, object]]) -> None:
        """Dynamic nodes: ``scontrol create NodeName=<names> Key=Value...`` in one call
        (slurmctld parses it as a slurm.conf NodeName line). Each value must be one word
        Slurm reads back as it is (SlurmSyntaxError before anything is asked)."""
        check_names(names)
        args = ["create", f"NodeName={compress(list(names))}"]
        args += [f"{key}={word(value, key)}" for key, value in settings]
        log.info("slurm.create nodes=%d hostlist=%s", len(names), compress(list(names)))
        self._cmd("scontrol", *args)

    def delete_nodes(self, names: Sequence[str]) -> None:
        """``scontrol delete NodeName=<names>``, in batches: Slurm deletes each dynamic
        node that holds no job and no reservation and names the rest in its error."""
        check_names(names)
        for start in range(0, len(names), self.batch):
            chunk = list(names[start : start + self.batch])
            log.info("slurm.delete nodes=%d hostlist=%s", len(chunk), compress(chunk))
            self._cmd("scontrol", "delete", f"NodeName={compress(chunk)}")


def parse_oneliners(text: str) -> dict[str, SlurmNode]:
    """``scontrol show node --oneliner`` -> {name: node (name, state and flags only)}.

    Only the first ``NodeName=`` and ``State=`` of a line count: a node's reason comes
    later on its line and is free text (it may say ``State=`` too). Lines that are not a
    node's (``Node x not found``) are skipped.
    """
    out = {}
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for token in line.split(" "):
            key, sep, value = token.partition("=")
            if sep and key in ("NodeName", "State") and key not in fields:
                fields[key] = value
            if key == "Reason":
                break
        if "NodeName" in fields and "State" in fields:
            state, flags = parse_state_field(fields["State"])
            out[fields["NodeName"]] = SlurmNode(fields["NodeName"], state, flags)
    return out
