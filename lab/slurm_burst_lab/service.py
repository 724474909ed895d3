"""``slurm-burst lab up | down | status``: a whole hybrid cluster on one machine.

``up`` starts, in order: the LAN bridge, the lab's own munged (own key, own
socket), slurmctld (in its own UTS namespace, so ``SlurmctldHost`` is its
hostname), the on-prem nodes as namespace VMs running munged and slurmd, and
the namespace cloud's "internet" bridge. It waits until Slurm shows the on-prem
nodes idle and every burst node ``idle~``. What it started is recorded in
``lab.json`` so that ``down`` removes exactly that: processes, namespaces,
veths, bridges and the state directory, and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_burst.adapters.proc import alive, pid_start_time
from slurm_burst.config import Config, load_config
from slurm_burst.core.slurm import SchedulerError
from slurm_burst.services.slurmconf import install_hooks
from slurm_burst.wiring.clouds import cloud_driver
from slurm_burst.wiring.daemon import mesh_hub
from slurm_burst.wiring.light import scheduler
from slurm_burst_lab import accounting, images, ociimage, runtimeref, simnvml, slurmfeatures
from slurm_burst_lab import components as c
from slurm_burst_lab.config import settings
from slurm_burst_lab.labvms import register_image
from slurm_burst_lab.nscloud import net, vm
from slurm_burst_lab.slurmroot import RootError, SlurmRoot, remove_tree

log = logging.getLogger(__name__)

REQUIRED_PROGRAMS = (
    "slurmctld",
    "slurmd",
    "munged",
    "sshd",
    "ssh-keygen",
    "ip",
    "nsenter",
    "unshare",
    "mount",
    "runuser",
    "sinfo",
    "scontrol",
    "slurmdbd",
    "sacctmgr",
    "sacct",
    "mariadb",
)
Progress = Callable[[str], None]


class LabError(RuntimeError):
    """The lab cannot be brought up or down; the message says what to do."""


@dataclass
class Lab:
    cfg: Config
    progress: Progress = lambda msg: None
    release: str | None = None  # Slurm to run (images.SUPPORTED); None: what runs, or the host's

    def __post_init__(self) -> None:
        try:
            self.lab = settings(self.cfg)
        except LookupError as exc:
            raise LabError(str(exc)) from exc
        self.paths = c.Paths(Path(self.lab.state_dir))
        self.slurm_conf = Path(self.cfg.slurm.conf_dir) / "slurm.conf"
        self.slurm = scheduler(self.cfg, timeout=10)
        if self.release is not None and self.release not in images.SUPPORTED:
            raise LabError(
                f"the lab runs Slurm {', '.join(images.SUPPORTED)}, not {self.release!r} "
                f"({images.HOST_RELEASE} is the host's own; the others come from images)"
            )
        bin_dir = Path(self.cfg.slurm.bin_dir)
        if bin_dir != SlurmRoot(images.HOST_RELEASE, self.paths.state).bin:
            raise LabError(
                f"{self.cfg.source}: slurm.bin_dir must be {self.paths.state}/slurm/bin in a "
                f"lab config (where the lab puts the commands of the Slurm it runs), not {bin_dir}"
            )

    def running_release(self) -> str | None:
        """The Slurm release of the lab as recorded (None: no lab)."""
        return _release_of(self._read_record())

    def env(self) -> dict[str, str]:
        """What Slurm's commands need to reach the lab: its slurm.conf, and the commands of
        the release it runs first on PATH."""
        path = f"{self.slurm_root().bin}:/usr/sbin:/usr/bin:/sbin:/bin"
        return {"SLURM_CONF": str(self.slurm_conf), "PATH": path}

    def slurm_root(self, release: str | None = None) -> SlurmRoot:
        rel = release or self.release or self.running_release() or images.HOST_RELEASE
        return SlurmRoot(rel, self.paths.state)

    # -- preconditions --------------------------------------------------------
    @staticmethod
    def preflight() -> None:
        if os.geteuid() != 0:
            raise LabError("the lab needs root (namespaces, bridges, munge): run it with sudo")
        missing = [
            p
            for p in REQUIRED_PROGRAMS
            if not shutil.which(p, path="/usr/sbin:/usr/bin:/sbin:/bin")
        ]
        if missing:
            raise LabError(
                f"missing programs: {', '.join(missing)}; run 'make demo' or "
                "scripts/setup-system.sh to install them"
            )

    def cloud(self) -> Any:
        return cloud_driver(self.cfg.providers[self.lab.cloud_provider])

    # -- up -------------------------------------------------------------------
    def up(self, timeout: float = 60.0) -> dict[str, Any]:
        self.preflight()
        record = self._read_record()
        want = self.release or images.HOST_RELEASE
        running = _release_of(record)
        if record and self._all_alive(record) and running == want:
            self.progress(f"lab is already up (Slurm {running})")
            return self.status()
        if record and running != want:
            self.progress(f"the lab runs Slurm {running}: taking it down for {want}")
            self.down()
        elif record or self.paths.state.exists():
            self.progress("cleaning up an incomplete lab first")
            self.down()
        try:
            return self._up(timeout)
        except BaseException:
            # a failed 'up' stops what it started: nothing half-made keeps running
            self.progress("lab up failed: removing what it started (its logs kept)")
            try:  # the logs kept first, but keeping them never stops the removal
                self._keep_logs()
            except OSError:
                log.exception("lab.up.keep_logs_failed")
            try:
                self.down()
            except Exception:
                log.exception("lab.up.cleanup_failed")
            raise

    def _keep_logs(self) -> None:
        """Move the log directory out of the state directory ``down`` removes, to
        ``paths.failed_up_logs`` (the last failed up's only): what failed stays readable."""
        kept = self.paths.failed_up_logs
        if kept.is_dir() and not kept.is_symlink():
            shutil.rmtree(kept)
        else:  # a link, a file, a FIFO: removed, never followed
            kept.unlink(missing_ok=True)
        if self.paths.log.is_dir() and not self.paths.log.is_symlink():
            self.paths.log.rename(kept)

    def _up(self, timeout: float) -> dict[str, Any]:
        started = time.monotonic()
        for d in (self.paths.state, self.paths.run, self.paths.log):
            d.mkdir(parents=True, exist_ok=True)
        root = self.slurm_root(self.release or images.HOST_RELEASE)
        record: dict[str, Any] = {
            "started_at": time.time(),
            "config": self.cfg.source,
            "slurm": root.release,
            "processes": {},
            "onprem": {},
            "bridges": [c.LAN_BRIDGE],
        }
        self._write_record(record)
        self.progress("network: LAN bridge")
        c.ensure_lan(self.cfg)
        self.progress("munge: key and daemon")
        c.ensure_munge_key(self.paths)
        record["processes"]["munged"] = vars(c.start_munged(self.paths))
        self._write_record(record)
        install_hooks(self.cfg.slurm.hook_dir, str(Path(self.cfg.source).resolve()))
        Path(self.lab.shared_dir).mkdir(parents=True, exist_ok=True)
        if root.host:
            self.progress(f"slurm {root.release}: the host's own")
        else:
            self.progress(f"slurm {root.release}: its image, the controller root at {root.root}")
        root.setup(self.cfg.slurm.hook_dir, [self.lab.shared_dir], self.progress)
        slurmfeatures.disable(Path(self.cfg.source))  # whatever an earlier up left
        if slurmfeatures.wanted(root.release):
            self.progress(
                f"slurm: node group {slurmfeatures.GROUP} is dynamic (Slurm {root.release}): "
                "the daemon creates its nodes in slurmctld"
            )
            slurmfeatures.enable(self.cfg, root.release)
        self.cfg = load_config(Path(self.cfg.source))  # with the drop-ins as they are now
        self.progress("slurm: configuration and power-saving hooks")
        c.write_slurm_conf(self.cfg, self.paths)
        self.progress("slurm: slurmdbd (accounting in MariaDB), cluster and accounts")
        accounting.check_mariadb()
        dbd = accounting.start_slurmdbd(self.cfg, self.paths, self.slurm_conf, root.prefix())
        record["processes"]["slurmdbd"] = vars(dbd)
        self._write_record(record)
        accounting.ensure_associations(self.cfg, self.slurm_conf)
        self.progress("slurm: slurmctld")
        ctld = c.start_slurmctld(self.cfg, self.paths, self.slurm_conf, root.prefix())
        record["processes"]["slurmctld"] = vars(ctld)
        self._write_record(record)
        c.wait_for(self.slurm.ping, 30, "slurmctld answering ping", ctld)
        self.progress("cloud: 'internet' bridge of the namespace cloud")
        cloud = self.cloud()
        cloud.ex_ensure_network()
        image = root.image()
        cloud.ex_set_host_image(str(image) if image else None, (self.lab.shared_dir,))
        self._gpu_node_software()
        record["bridges"].append(cloud.bridge)
        if self.cfg.staging.store:
            self.progress("cloud: S3 object store for stage-in (rclone serve s3 on that bridge)")
            record["processes"]["s3"] = vars(c.start_s3(self.cfg, self.paths))
            self._write_record(record)
        for key, what, provider, start in (
            ("ec2", "EC2", self.lab.ec2_provider, c.start_ec2),
            ("gce", "GCE", self.lab.gce_provider, c.start_gce),
            ("azure", "Azure", self.lab.azure_provider, c.start_azure),
        ):
            if not provider:
                continue
            self.progress(f"cloud: {what} emulator (its instances boot as VMs on that bridge)")
            record["processes"][key] = vars(start(self.cfg, self.paths))
            self._write_record(record)
            # on another release its instances boot that release's image, as the
            # namespace cloud's VMs do: their slurmd is the controller's release
            for name in {g.image for g in self.cfg.node_groups.values()
                         if provider in g.providers}:  # fmt: skip
                register_image(self.paths.state / key, name, image, (self.lab.shared_dir,))
        container = self._container_image(root.host)
        if self.lab.daemon:
            self.progress("slurm-burst daemon (WireGuard hub, provisioning)")
            record["processes"]["daemon"] = vars(c.start_daemon(self.cfg, self.paths))
            self._write_record(record)
        if self.lab.prometheus:
            self.progress(
                f"prometheus: scrapes the daemon, alert rules (http://{self.lab.prometheus})"
            )
            record["processes"]["prometheus"] = vars(c.start_prometheus(self.cfg, self.paths))
            self._write_record(record)
        self.progress("on-prem: booting static nodes")
        record["onprem"] = c.boot_onprem(self.cfg, self.paths, root.image())
        self._write_record(record)
        self.progress("slurm: waiting for on-prem nodes idle and burst nodes idle~")
        remaining = max(5.0, timeout - (time.monotonic() - started))
        c.wait_for(self._ready, remaining, "nodes ready", ctld)
        if container is not None:
            self.progress("images: the on-prem node loads the lab's image (as from a registry)")
            ociimage.load_onprem(record["onprem"], *container)
        if self.lab.runtime_reference:
            self.progress("runtime: the on-prem reference manifest (slurm-burst runtime capture)")
            runtimeref.capture_reference(self.lab, record["onprem"])
        record["up_seconds"] = round(time.monotonic() - started, 2)
        self._write_record(record)
        self.progress(f"lab is up in {record['up_seconds']} s")
        return self.status()

    def _container_image(self, host: bool) -> tuple[Path, str] | None:
        """The lab's container image built in the shared directory and pinned for group
        direct (a drop-in of the config, read by the daemon it starts next); None on a
        release whose image has no podman."""
        ociimage.unpin(Path(self.cfg.source))  # whatever an earlier up left
        for d in ("/var/lib/containers", "/run/containers", "/run/libpod"):
            Path(d).mkdir(mode=0o700, exist_ok=True)  # each VM hides them (its own)
        if not host or not shutil.which("podman") or not Path(ociimage.BUSYBOX).exists():
            self.progress("images: none (podman is in the host's release only)")
            return None
        self.progress("images: the lab's container image, an OCI layout pinned by digest")
        layout = Path(self.lab.shared_dir) / "images" / ociimage.KEY
        digest = ociimage.build(layout)
        ociimage.pin(Path(self.cfg.source), layout, digest)
        return layout, digest

    def _ready(self) -> bool:
        try:
            nodes = self.slurm.nodes()
        except SchedulerError:
            return False
        onprem = set(c.onprem_names(self.lab))
        burst = {n for g in self.cfg.node_groups.values() for n in g.slurm_names()}
        seen = {n.name: n for n in nodes}
        return all(
            n in seen and seen[n].state == "idle" and not seen[n].flags & {"NOT_RESPONDING"}
            for n in onprem
        ) and all(n in seen and seen[n].sinfo_state == "idle~" for n in burst)

    def restart(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one of the lab's processes (``daemon`` or ``slurmctld``; SIGKILL: as a crash
        would) and start it again, as systemd would; return once it answers again."""
        self.stop(name, sig)
        self.start(name)

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop the lab's ``daemon`` or ``slurmctld`` with ``sig``; wait until it is gone."""
        record = self._record_for(name)
        info = (record.get("processes") or {}).get(name)
        if info:
            proc = c.Proc(info["pid"], info["start"])
            if proc.alive:
                os.kill(proc.pid, sig)
                c.wait_for(lambda: not proc.alive, 30, f"{name} to stop")

    def start(self, name: str) -> None:
        """Start the lab's ``daemon`` or ``slurmctld`` (again); return once it answers."""
        record = self._record_for(name)
        if name == "daemon":
            started = c.start_daemon(self.cfg, self.paths)
        else:
            prefix = self.slurm_root().prefix()
            started = c.start_slurmctld(self.cfg, self.paths, self.slurm_conf, prefix)
        record["processes"][name] = vars(started)
        self._write_record(record)
        if name == "slurmctld":
            c.wait_for(self.slurm.ping, 30, "slurmctld answering ping", started)

    def _record_for(self, name: str) -> dict[str, Any]:
        if name not in ("daemon", "slurmctld"):
            raise LabError(f"the lab cannot stop or start {name!r} (only daemon, slurmctld)")
        record = self._read_record()
        if record is None:
            raise LabError("the lab is not up")
        return record

    # -- down -----------------------------------------------------------------
    def down(self) -> list[str]:
        """Remove everything the lab made; return what was removed (for the report)."""
        self.preflight()
        removed: list[str] = []
        record = self._read_record() or {}
        daemon = (record.get("processes") or {}).get("daemon")
        if daemon:  # first: it must not act on what is being removed
            c.stop(c.Proc(daemon["pid"], daemon["start"]), grace=10.0)
            removed.append("daemon")
        for key, what in (("ec2", "EC2 emulator"), ("gce", "GCE emulator"),
                          ("azure", "Azure emulator")):  # fmt: skip
            emu = (record.get("processes") or {}).get(key)
            if emu:  # it halts its VMs on SIGTERM
                c.stop(c.Proc(emu["pid"], emu["start"]), grace=20.0)
                removed.append(what)
        if self.paths.state.exists():
            c.stop_emulator_vms(self.paths)
        if self.paths.state.exists() or record:
            try:
                self.cloud().ex_teardown(every_vm_network=True)
                removed.append("cloud VMs and bridge")
            except Exception as exc:  # keep going: down must always finish
                log.warning("lab.down cloud teardown failed: %s", exc)
        for name, info in (record.get("onprem") or {}).items():
            vm.halt(Path(info["vmdir"]), info.get("launcher_pid"), info.get("launcher_start"))
            removed.append(f"on-prem node {name}")
        for name in ("s3", "prometheus", "slurmctld", "slurmdbd", "munged"):
            info = (record.get("processes") or {}).get(name)
            if info:
                c.stop(c.Proc(info["pid"], info["start"]))
                removed.append(name)
        root = self.slurm_root(_release_of(record))
        if root.base.exists():  # another release's controller root (mounts and all)
            try:
                root.remove()
            except RootError as exc:
                raise LabError(f"{exc}; unmount it and run 'lab down' again") from exc
            removed.append(f"Slurm {root.release} controller root {root.base}")
        if accounting.drop_database(self.cfg):
            removed.append(f"accounting database {self.lab.accounting_db}")
        removed += self._sweep()
        hub = mesh_hub(self.cfg)
        if net.link_exists(hub.interface):
            hub.down()
            removed.append(f"WireGuard hub {hub.interface}")
        if Path(self.lab.shared_dir).exists():
            shutil.rmtree(self.lab.shared_dir)
            removed.append(self.lab.shared_dir)
        if ociimage.unpin(Path(self.cfg.source)):
            removed.append("the config's drop-in pinning the lab's image")
        if slurmfeatures.disable(Path(self.cfg.source)):
            removed.append("the config's drop-in of the dynamic node group")
        for bridge in [c.LAN_BRIDGE, *record.get("bridges", [])]:
            if net.link_exists(bridge):
                net.delete_link(bridge)
                removed.append(f"bridge {bridge}")
        if self.paths.state.exists():
            try:
                remove_tree(self.paths.state)
            except RootError as exc:
                raise LabError(f"{exc}; unmount it and run 'lab down' again") from exc
            removed.append(str(self.paths.state))
        return removed

    def _sweep(self) -> list[str]:
        """Processes and namespaces of the lab that the record missed (a crashed 'up').

        Only the lab's own programs are candidates: an admin's ``tail -f`` of a lab
        log names the state directory too, and is not ours to kill.
        """
        removed = []
        marker = str(self.paths.state)
        config = str(Path(self.cfg.source).resolve())
        for pid in _pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            cmdline = b" ".join(argv).decode(errors="replace")
            ours = (marker in cmdline and _is_lab_program(argv, cmdline)) or (
                config in cmdline and b"daemon" in argv  # the lab's slurm-burst daemon
            )
            if ours and pid != os.getpid():
                start = pid_start_time(pid)
                c.stop(c.Proc(pid, start or 0), grace=2.0)
                removed.append(f"stray process {pid}")
        for ns in net.list_netns("sbl-"):
            net.delete_guest_network(ns, "")
            removed.append(f"netns {ns}")
        return removed

    # -- status -----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        record = self._read_record()
        if record is None:
            return {"up": False, "state_dir": str(self.paths.state)}
        procs = {
            name: {**info, "alive": alive(info["pid"], info["start"])}
            for name, info in record.get("processes", {}).items()
        }
        onprem = {
            name: {
                **info,
                "alive": alive(info["launcher_pid"], info["launcher_start"]),
                "vm": vm.read_status(Path(info["vmdir"])).get("state"),
            }
            for name, info in record.get("onprem", {}).items()
        }
        nodes: list[dict[str, Any]] = []
        if procs.get("slurmctld", {}).get("alive"):
            try:
                nodes = [
                    {
                        "name": n.name,
                        "state": n.sinfo_state,
                        "partitions": list(n.partitions),
                        "addr": n.addr,
                    }
                    for n in self.slurm.nodes()
                ]
            except SchedulerError as exc:
                nodes = [{"error": str(exc)}]
        vms = []
        if self.paths.state.exists():
            vms = [
                {
                    "id": n.id,
                    "name": n.name,
                    "state": n.state,
                    "ip": n.public_ips,
                    "size": n.extra.get("size"),
                }
                for n in self.cloud().list_nodes()
            ]
        return {
            "up": self._all_alive(record),
            "slurm_release": _release_of(record),
            "slurm_bin": str(self.slurm_root().bin),
            "state_dir": str(self.paths.state),
            "slurm_conf": str(self.slurm_conf),
            "up_seconds": record.get("up_seconds"),
            "processes": procs,
            "onprem": onprem,
            "slurm_nodes": nodes,
            "cloud_vms": vms,
        }

    # -- record -----------------------------------------------------------------
    def _read_record(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.paths.record.read_text()))
        except (OSError, ValueError):
            return None

    def _gpu_node_software(self) -> None:
        """What the lab's GPU VMs need: the simulated NVML their "driver" is, and (on the
        shared filesystem, like a site's /apps) a Python with nvidia-ml-py."""
        opts = self.cfg.providers[self.lab.cloud_provider].options
        library = str(opts.get("nvml_library", ""))
        if not library or not any(g.gpus for g in self.cfg.node_groups.values()):
            return
        self.progress("cloud: simulated NVML for GPU VMs (gcc) and the nodes' nvidia-ml-py")
        simnvml.build(Path(library).parent)
        simnvml.ensure_node_python(Path(self.cfg.gpu.node_python))

    def _write_record(self, record: dict[str, Any]) -> None:
        vm.write_json_atomic(self.paths.record, record)

    @staticmethod
    def _all_alive(record: dict[str, Any]) -> bool:
        procs = record.get("processes", {})
        onprem = record.get("onprem", {})
        return (
            bool(procs)
            and bool(onprem)
            and all(alive(p["pid"], p["start"]) for p in procs.values())
            and all(alive(o["launcher_pid"], o["launcher_start"]) for o in onprem.values())
        )


LAB_PROGRAMS = frozenset(
    {"munged", "slurmctld", "slurmdbd", "slurmd", "sshd", "unshare", "nsenter", "prometheus"}
)
LAB_MODULES = ("slurm_burst_lab.",)


def _is_lab_program(argv: list[bytes], cmdline: str) -> bool:
    name = os.path.basename(argv[0].decode(errors="replace")) if argv and argv[0] else ""
    return name in LAB_PROGRAMS or any(m in cmdline for m in LAB_MODULES)


def _release_of(record: dict[str, Any] | None) -> str | None:
    """The Slurm release a lab record says the lab runs (None: no record)."""
    return None if record is None else str(record.get("slurm", images.HOST_RELEASE))


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]
