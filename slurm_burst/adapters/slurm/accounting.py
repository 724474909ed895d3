"""Slurm accounting: finished jobs from ``sacct --json``, budgets as association limits.

- ``finished_jobs``: one ``sacct`` call per window, all users, allocations only
  (``-X``), every run of a requeued job (``-D``), burst partitions only. Times
  come from the JSON as epoch seconds, so no local-time ambiguity.
- ``usage`` and ``set_billing_limit``: an account's billing minutes as
  slurmctld counts them (used this period, held by running jobs, the limit), and
  its ``GrpTRESMins=billing`` limit (``sacctmgr``; -1 removes it). slurmdbd
  pushes limit changes to slurmctld at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slurm_burst.adapters.proc import CommandError, Result, run
from slurm_burst.adapters.slurm.cli import SlurmError
from slurm_burst.core.usage import FINISHED, AssocUsage, JobUsage

log = logging.getLogger(__name__)
# more than any job holds of one TRES (memory is counted in MB): a larger count is corrupt
MAX_TRES = 2**40
READ_TRES = frozenset({"cpu", "gres/gpu", "mem", "node"})  # what a job's ledger row holds

Runner = Callable[..., Result]
NOTHING_FOUND = 9003  # ESLURM_REST_EMPTY_RESULT: 'Nothing found with query'


class SlurmAccounting:
    def __init__(
        self,
        bin_dir: str,
        slurm_conf: str | None,
        cluster: str,
        timeout: float = 60.0,
        runner: Runner = run,
    ) -> None:
        self.bin = Path(bin_dir)
        self.env = {"SLURM_CONF": slurm_conf} if slurm_conf else None
        self.cluster = cluster
        self.timeout = timeout
        self._run = runner

    def _cmd(self, tool: str, *args: str) -> str:
        try:
            return self._run(
                [str(self.bin / tool), *args], timeout=self.timeout, env=self.env
            ).stdout
        except CommandError as exc:
            raise SlurmError(
                f"{tool} {' '.join(args[:3])}", exc.stderr.strip() or exc.reason
            ) from exc

    # -- usage --------------------------------------------------------------------
    def finished_jobs(
        self, start: datetime, end: datetime, partitions: Sequence[str]
    ) -> list[JobUsage]:
        """Jobs of ``partitions`` active in [start, end] that have ended."""
        text = self._cmd(
            "sacct", "--json", "--allusers", "--allocations", "--duplicates",
            f"--clusters={self.cluster}",
            f"--starttime={_local(start)}", f"--endtime={_local(end)}",
            f"--partition={','.join(partitions)}",
        )  # fmt: skip
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise SlurmError("sacct --json", f"did not print JSON: {exc}") from exc
        for err in doc.get("errors") or []:
            if isinstance(err, dict) and err.get("error_number") == NOTHING_FOUND:
                return []  # 22.05 reports an empty window as an error
            raise SlurmError("sacct --json", str(err))
        out = []
        for raw in doc.get("jobs") or []:
            job = parse_job(raw, self.cluster)
            if job is not None:
                out.append(job)
        return out

    # -- budgets --------------------------------------------------------------------
    def usage(self, account: str) -> AssocUsage:
        """``account``'s billing minutes as slurmctld counts them (``scontrol show assoc_mgr``)."""
        text = self._cmd("scontrol", "show", "assoc_mgr", f"accounts={account}", "flags=assoc")
        return parse_assoc_usage(text, account)

    def has_account(self, account: str) -> bool:
        """Whether Slurm's accounting database knows ``account`` on this cluster."""
        text = self._cmd(
            "sacctmgr", "--noheader", "--parsable2", "show", "association",
            "where", f"account={account}", f"cluster={self.cluster}", "format=Account",
        )  # fmt: skip
        return any(line.strip() == account for line in text.splitlines())

    def set_billing_limit(self, account: str, minutes: int | None) -> None:
        """Set (or with None remove) ``GrpTRESMins=billing=minutes`` on the account."""
        value = "-1" if minutes is None else str(max(0, int(minutes)))
        self._cmd(
            "sacctmgr", "--immediate", "modify", "account", "where", f"name={account}",
            f"cluster={self.cluster}", "set", f"GrpTRESMins=billing={value}",
        )  # fmt: skip
        log.info("budget.slurm_limit account=%s billing_minutes=%s", account, value)


def parse_assoc_usage(text: str, account: str) -> AssocUsage:
    """The account-level record (``UserName=`` empty) of ``scontrol show assoc_mgr``."""
    record: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("ClusterName="):
            fields = dict(f.partition("=")[::2] for f in line.split())
            inside = fields.get("Account") == account and fields.get("UserName") == ""
            continue
        if inside:
            record.append(line.strip())
    if not record:
        raise SlurmError("scontrol show assoc_mgr", f"no association for account {account!r}")
    values: dict[str, tuple[str, str]] = {}
    for line in record:
        key, _, rest = line.partition("=")
        if key in ("GrpTRESMins", "GrpTRESRunMins"):
            values[key] = _tres_used(rest).get("billing", ("N", "0"))
    limit, used = values.get("GrpTRESMins", ("N", "0"))
    _, running = values.get("GrpTRESRunMins", ("N", "0"))
    return AssocUsage(
        used=int(float(used or 0)),
        running=int(float(running or 0)),
        limit=None if limit in ("N", "") else int(float(limit)),
    )


def _tres_used(text: str) -> dict[str, tuple[str, str]]:
    """``cpu=N(0),billing=998746(35)`` -> {"billing": ("998746", "35"), ...}."""
    out = {}
    for item in text.split(","):
        k, sep, v = item.partition("=")
        if sep:
            limit, _, used = v.partition("(")
            out[k.strip()] = (limit.strip(), used.rstrip(")").strip())
    return out


def parse_job(raw: dict[str, Any], cluster: str) -> JobUsage | None:
    """A finished job from one element of ``sacct --json``'s ``jobs`` (v0.0.38 of 22.05,
    v0.0.42 of 24.11, v0.0.45 of 26.05: the fields read here differ only in ``state``);
    None if it has not ended."""
    t = raw.get("time") or {}
    current = (raw.get("state") or {}).get("current") or ""
    if isinstance(current, list):  # v0.0.40 on (24.11, 26.05): ["COMPLETED"], flags after
        # a requeued life's record is ["PENDING", "REQUEUED"] (22.05: "REQUEUED"): it
        # ran, and its instance-hours are charged as 22.05's are
        flags = [str(x) for x in current]
        current = "REQUEUED" if "REQUEUED" in flags[1:] else (flags[0] if flags else "")
    state = str(current).split()[0] if str(current).split() else ""
    start, end = int(t.get("start") or 0), int(t.get("end") or 0)
    if state not in FINISHED or not start or not end or end < start:
        return None
    alloc = {}
    for tres in (raw.get("tres") or {}).get("allocated") or []:
        key = tres.get("type", "") + (f"/{tres['name']}" if tres.get("name") else "")
        if key not in READ_TRES:  # others may say "not measured" (energy: -2 on 24.11)
            continue
        count = tres.get("count") or 0
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_TRES:
            # a negative GPU count would be charged and reported as negative use
            log.error("ledger.job_refused job=%s tres=%s count=%r: not a count",
                      raw.get("job_id"), key[:40], str(count)[:40])  # fmt: skip
            return None
        alloc[key] = count
    return JobUsage(
        cluster=str(raw.get("cluster") or cluster),
        job_id=int(raw["job_id"]),
        account=str(raw.get("account") or ""),
        user=str(raw.get("user") or ""),
        partition=str(raw.get("partition") or ""),
        nodes=str(raw.get("nodes") or ""),
        node_count=int(raw.get("allocation_nodes") or alloc.get("node", 0)),
        cpus=alloc.get("cpu", 0),
        gpus=alloc.get("gres/gpu", 0),
        mem_mb=alloc.get("mem", 0),
        submit=datetime.fromtimestamp(int(t.get("submission") or start), UTC),
        start=datetime.fromtimestamp(start, UTC),
        end=datetime.fromtimestamp(end, UTC),
        state=state,
    )


def _local(t: datetime) -> str:
    """sacct reads times in the local zone of the host it runs on."""
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
