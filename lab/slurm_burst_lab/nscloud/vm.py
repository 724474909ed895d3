"""Host side of a namespace VM: its spec on disk, boot, status and halt.

A VM is a directory (spec.json, user-data, console.log, status.json) plus a
process tree: the *launcher* (host side; after the boot delay it becomes
``unshare``) and the VM's PID 1, ``vminit``, inside new mount, UTS, PID and time
namespaces and the VM's network namespace. Killing PID 1 ends every process of
the VM; its mounts die with its mount namespace; deleting the netns removes its
veth. Nothing else of a VM lives on the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurm_burst.adapters.proc import alive, spawn_detached
from slurm_burst_lab.nscloud import net

# What a VM must never see of its host: secrets and other machines' state.
DEFAULT_HIDE = (
    "/etc/munge",
    "/etc/wireguard",
    "/etc/slurm-burst",
    "/root/.ssh",
    "/var/lib/munge",
    "/var/lib/slurm-burst",
    "/var/log/munge",
    # podman's storage and run state: each VM its own images and containers
    "/var/lib/containers",
    "/run/containers",
    "/run/libpod",
)


@dataclass(frozen=True)
class VmSpec:
    """Everything vminit needs to boot; written to ``spec.json`` (no secrets in it)."""

    id: str
    hostname: str
    netns: str
    host_if: str
    bridge: str
    address: str  # CIDR, e.g. 10.251.0.10/24
    gateway: str
    boot_delay: float = 0.0
    hide: tuple[str, ...] = DEFAULT_HIDE
    authorized_keys: tuple[str, ...] = ()
    fresh_host_keys: bool = True
    extra_files: dict[str, str] = field(default_factory=dict)  # path -> public content
    # boot from this root filesystem (an image, seen through a private overlay) instead
    # of the host's own, with these host directories bound in at the same paths
    root: str = ""
    binds: tuple[str, ...] = ()
    # "vminit": vminit stays PID 1 and starts sshd; "systemd": the image's systemd becomes
    # PID 1 (a root image only), in a cgroup and cgroup namespace of the VM's own
    init: str = "vminit"
    # a GPU VM's NVIDIA library (the lab's simulated NVML): a host path, copied in at boot
    # to /run/simgpu/lib and made known to the VM's dynamic loader, as a driver install does
    nvml_library: str = ""

    @property
    def cgroups(self) -> tuple[str, ...]:
        """The VM's own cgroups (systemd init): the named systemd and unified hierarchies."""
        if self.init != "systemd":
            return ()
        return tuple(f"/sys/fs/cgroup/{h}/{self.netns}" for h in ("systemd", "unified"))

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]


def write_private(path: str | Path, data: str | bytes, mode: int = 0o600) -> None:
    """Create ``path`` with ``mode`` from the start (no window where it is readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write_private(tmp, json.dumps(data, indent=1, sort_keys=True), 0o644)
    os.replace(tmp, path)


def boot(vmdir: Path, spec: VmSpec, userdata: str | None) -> tuple[int, int]:
    """Start the VM's launcher, detached; return its (pid, start time)."""
    vmdir.mkdir(parents=True, exist_ok=True)
    os.chmod(vmdir, 0o700)
    write_json_atomic(vmdir / "spec.json", asdict(spec))
    if userdata:
        write_private(vmdir / "user-data", userdata, 0o600)
    return spawn_detached(
        [sys.executable, "-m", "slurm_burst_lab.nscloud.launcher", str(vmdir)],
        vmdir / "console.log",
    )


def read_status(vmdir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((vmdir / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def read_spec(vmdir: Path) -> VmSpec:
    data = json.loads((vmdir / "spec.json").read_text())
    data["hide"] = tuple(data["hide"])
    data["authorized_keys"] = tuple(data["authorized_keys"])
    data["binds"] = tuple(data.get("binds", ()))
    return VmSpec(**data)


def init_pid(launcher_pid: int) -> int | None:
    """Host pid of the VM's PID 1: the child of the launcher (by then ``unshare``)."""
    try:
        children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def halt(
    vmdir: Path, launcher_pid: int | None, launcher_start: int | None, grace: float = 3.0
) -> None:
    """Stop every process of the VM and remove its network (idempotent)."""
    try:
        spec: VmSpec | None = read_spec(vmdir)
    except (OSError, ValueError, TypeError):
        spec = None
    systemd = spec is not None and spec.init == "systemd"
    if systemd:
        grace = max(grace, 10.0)  # systemd stops its units first
    if launcher_pid and alive(launcher_pid, launcher_start):
        pid1 = init_pid(launcher_pid)
        if pid1:
            # vminit stops its services, then exits; systemd powers off on SIGRTMIN+4
            # (SIGTERM would make it re-execute itself)
            _signal(pid1, signal.SIGRTMIN + 4 if systemd else signal.SIGTERM)
        else:
            _signal(launcher_pid, signal.SIGKILL)  # still in its boot delay
        deadline = time.monotonic() + grace
        while alive(launcher_pid, launcher_start) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(launcher_pid, launcher_start):
            pid1 = init_pid(launcher_pid)
            if pid1:
                _signal(pid1, signal.SIGKILL)  # PID 1 of a pid namespace: takes all with it
            _signal(launcher_pid, signal.SIGKILL)
            while alive(launcher_pid, launcher_start) and time.monotonic() < deadline + grace:
                time.sleep(0.05)
    if spec is None:
        return
    for cgroup in spec.cgroups:  # depth first: systemd leaves its slices and scopes
        remove_cgroup(Path(cgroup))
    net.delete_guest_network(spec.netns, spec.host_if)


def remove_cgroup(path: Path) -> None:
    """Remove a cgroup directory and those below it (empty ones; idempotent)."""
    if not path.is_dir():
        return
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def enter_argv(launcher_pid: int) -> list[str]:
    """argv prefix running a command inside the VM (all its namespaces): tests, debugging."""
    pid1 = init_pid(launcher_pid)
    if pid1 is None:
        raise RuntimeError("the VM is not running")
    # -r -w: the VM's own root (an image's, when it booted from one) and directory
    return ["nsenter", "-t", str(pid1), "-m", "-u", "-n", "-p", "-T", "-r", "-w", "--"]
