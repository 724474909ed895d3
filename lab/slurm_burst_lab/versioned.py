"""A slurmctld of another Slurm release, run from its image: to check what ``conf render``
emits against that release, and the Scheduler port against its commands.

The image (``lab.images``) stays read-only: the controller runs in an overlay of it
(upper and work directories in ``work``), with /proc and /dev bound in, its own munged
(own key) and slurmctld on ports of its own (7817/7818: the lab's 22.05 controller
keeps 6817). Slurm's commands of that release run in it through ``chroot``; no shell
anywhere, node names and reasons stay argv elements. ``stop`` unmounts and removes
everything it made.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_burst.adapters.proc import CommandError, Result, run
from slurm_burst.config import Config
from slurm_burst.services.slurmconf import HOOKS, render, write_files
from slurm_burst_lab.components import Proc, onprem_names, spawn, stop
from slurm_burst_lab.config import settings
from slurm_burst_lab.slurmroot import overlay, remove_tree, unmount_all

PORT = 7817

BASE = """# slurm.conf of a versioned check controller, written by slurm_burst_lab.versioned
ClusterName={cluster}
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmctldPidFile=/run/slurmctld.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={dbd_port}
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# what the site's slurm.conf has for budgets (ledger.md); GRES/gpu billing weights need it
AccountingStorageTRES=gres/gpu
MailProg=/bin/true
Include slurm-burst.conf
NodeName={onprem} NodeAddr=127.0.0.2 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName={onprem_partition} Nodes={onprem} Default=YES MaxTime=INFINITE State=UP
"""
STUB = "#!/bin/sh\n# stands in for a slurm-burst program in a versioned check\nexit 0\n"

FIRST_START_NOISE = (
    "Could not open ",  # job, node, reservation, trigger state files: none yet
    "Trying backup state save file",
    "Trying backup burst buffer state save file",  # burst_buffer/lua's (stage-in)
    "No fed_mgr state file",
    "slurm_send_node_msg: ",  # our scontrol ping gave up while slurmctld started
)

DBD = """# slurmdbd.conf of a versioned check controller: the host's MariaDB, its own database
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc={db}
"""


class VersionedController:
    def __init__(
        self, image: Path, release: str, work: Path, cfg: Config, port: int = PORT
    ) -> None:
        self.image = image
        self.release = release
        self.work = work
        self.root = work / "root"
        self.cfg = cfg
        self.port = port
        self.procs: list[Proc] = []
        self.start_errors: list[str] = []  # slurmctld's error: lines of its start
        self.database = f"slurm_burst_check_{release.replace('.', '')}"

    # -- in the image -------------------------------------------------------------
    def run(self, argv: Sequence[str], **kw: Any) -> Result:
        """``argv`` inside the image's root (its Slurm commands, its slurm.conf)."""
        env = {"SLURM_CONF": "/etc/slurm/slurm.conf", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        return run(
            ["chroot", str(self.root), *argv], env={**env, **(kw.pop("env", None) or {})}, **kw
        )

    @property
    def log(self) -> Path:
        return self.root / "var" / "log" / "slurm" / "slurmctld.log"

    def errors(self) -> list[str]:
        """slurmctld's ``error:`` lines so far (what the release refuses or doubts), but
        those of a first start on an empty state directory, and a client of ours that
        gave up waiting for an answer while slurmctld was starting."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [
            line
            for line in text.splitlines()
            if "error:" in line and not any(n in line for n in FIRST_START_NOISE)
        ]

    # -- life -----------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> None:
        try:
            self._mount()
            self._configure()
            self._start_daemons(timeout)
            time.sleep(1.0)  # what slurmctld says right after it answers (dbd registration)
            self.start_errors = self.errors()
        except BaseException:
            self.stop()
            raise

    def _mount(self) -> None:
        overlay(self.image, self.work)  # at self.root
        # the host's MariaDB for slurmdbd, where each release's client looks for it
        binds = (("/proc", "proc"), ("/dev", "dev"), ("/run/mysqld", "run/mysqld"),
                 ("/run/mysqld", "run/mariadbd"))  # fmt: skip
        for src, inside in binds:
            target = self.root / inside
            target.mkdir(parents=True, exist_ok=True)
            run(["mount", "--bind", src, str(target)])

    def _configure(self) -> None:
        lab = settings(self.cfg)
        etc = self.root / "etc" / "slurm"
        etc.mkdir(parents=True, exist_ok=True)
        files = render(self.cfg, self.release)
        for name, text in files.items():
            (etc / name).write_text(text)
        (etc / "slurm.conf").write_text(
            BASE.format(
                cluster=self.cfg.cluster.name,
                host=socket.gethostname().split(".")[0],
                port=self.port,
                slurmd_port=self.port + 1,
                dbd_port=self.port + 2,
                onprem=onprem_names(lab)[0],
                onprem_partition=lab.onprem_partition,
            )
        )
        # the programs slurm.conf names must exist where slurmctld looks; ours run with
        # the controller host's Python, which the image does not hold: stubs that succeed
        # (cloud nodes stay powered down here; the on-prem node's jobs pass the prolog)
        hooks = self.root / self.cfg.slurm.hook_dir.lstrip("/")
        write_files(hooks, {name: STUB for name in HOOKS.values()}, 0o755)
        # Debian's own plugstack.conf globs a directory, which Slurm reports as an error
        (etc / "plugstack.conf").unlink(missing_ok=True)
        dbd = etc / "slurmdbd.conf"
        dbd.write_text(DBD.format(dbd_port=self.port + 2, db=self.database))
        dbd.chmod(0o600)
        for d in ("var/lib/slurm/slurmctld", "var/log/slurm", "run/munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.run(["chown", "munge:munge", "/run/munge", "/etc/munge"])
        key = self.root / "etc" / "munge" / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(1024))
            self.run(["chown", "munge:munge", "/etc/munge/munge.key"])

    def _start_daemons(self, timeout: float) -> None:
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        chroot = ["chroot", "--userspec=munge:munge", str(self.root)]
        self.procs.append(spawn([*chroot, "/usr/sbin/munged", "--foreground"], logs / "munged.out"))
        self._wait(lambda: (self.root / "run/munge/munge.socket.2").exists(), timeout, "munged")
        dbd = ["chroot", str(self.root), "/usr/sbin/slurmdbd", "-D"]
        self.procs.append(spawn(dbd, logs / "slurmdbd.out"))
        self._wait(self._dbd_answers, timeout, "slurmdbd answering")
        argv = ["chroot", str(self.root), "/usr/sbin/slurmctld", "-D", "-i"]
        self.procs.append(
            spawn(argv, logs / "slurmctld.out", env={"SLURM_CONF": "/etc/slurm/slurm.conf"})
        )
        self._wait(self._pings, timeout, "slurmctld answering")

    def start_onprem_node(self, timeout: float = 30.0) -> str:
        """Start slurmd for the on-prem node in the image (host network, no cgroups), so
        that jobs run and accounting records them; returns the node's name."""
        node = onprem_names(settings(self.cfg))[0]
        target = self.root / "sys"
        run(["mount", "--bind", "/sys", str(target)])  # hwloc reads the topology
        (self.root / "var/spool/slurmd").mkdir(parents=True, exist_ok=True)
        (self.root / "etc/slurm/cgroup.conf").write_text("CgroupPlugin=disabled\n")
        argv = ["chroot", str(self.root), "/usr/sbin/slurmd", "-D", "-N", node]
        self.procs.append(spawn(argv, self.work / "logs" / "slurmd.out"))

        def idle() -> bool:
            try:
                out = self.run(["sinfo", "-h", "-n", node, "-o", "%T"], timeout=5).stdout
            except CommandError:
                return False
            return out.strip() == "idle"

        self._wait(idle, timeout, f"{node} idle")
        return node

    def _dbd_answers(self) -> bool:
        try:
            self.run(["sacctmgr", "--noheader", "show", "cluster"], timeout=5)
            return True
        except CommandError:
            return False

    def _pings(self) -> bool:
        try:
            return " is UP" in self.run(["scontrol", "ping"], timeout=5).stdout
        except CommandError:
            return False

    def _wait(self, cond: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline or (self.procs and not self.procs[-1].alive):
                out = (self.work / "logs").glob("*.out")
                said = "; ".join(p.read_text(errors="replace")[-500:] for p in out)
                raise RuntimeError(f"{what}: not ready after {timeout:g} s ({said})")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)
        self.procs.clear()
        with contextlib.suppress(CommandError):
            run(["mariadb", "-u", "root", "-e", f"DROP DATABASE IF EXISTS {self.database}"])
        # what is still mounted is read from the kernel; a tree with a mount left below
        # it (a bound /dev or /proc) is never walked into, it stays in place (RootError)
        unmount_all(self.work)
        remove_tree(self.work)
