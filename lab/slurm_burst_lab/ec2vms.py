"""The EC2 emulator's instances as namespace VMs (the lab's VM machinery), opt-in.

With booting on (``python -m slurm_burst_lab.ec2emu PORT --boot ...``, as ``lab up``
starts it), each instance a RunInstances makes boots as a VM on the lab's cloud bridge:
its address is the instance's private IP (the emulator's default subnet is a range of
the bridge's subnet), it runs the request's user-data, root's authorized key is the
public key of the request's key pair (as cloud-init installs it), and its console, with
the host-key block, is what GetConsoleOutput serves. TerminateInstances halts it.
An instance boots the host's own file system, or, for an AMI that
``state_dir/images.json`` maps to a root file system (``{"ami-…": "/path"}``; see
:func:`register_image`), that image through a private overlay.
Without booting, the emulator stays API-only (the 1,000-instance benchmarks).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import logging
import shutil
import threading
from pathlib import Path

from slurm_burst_lab.nscloud import net, vm

log = logging.getLogger(__name__)


class Ec2Vms:
    """Namespace VMs for EC2 instance ids, under ``state_dir/vms/<instance id>``."""

    def __init__(
        self,
        state_dir: str | Path,
        bridge: str,
        subnet: str,
        boot_delay: float = 2.0,
        hide: tuple[str, ...] = (),
    ) -> None:
        self.state_dir = Path(state_dir)
        self.bridge = bridge
        self.subnet = ipaddress.ip_network(subnet)
        self.gateway = str(next(self.subnet.hosts()))
        self.boot_delay = boot_delay
        self.hide = (*vm.DEFAULT_HIDE, *hide)
        self._keys: dict[str, str] = {}  # key pair name -> public key line
        self._lock = threading.Lock()

    def ensure_network(self) -> None:
        net.ensure_bridge(self.bridge, f"{self.gateway}/{self.subnet.prefixlen}")

    def import_key(self, name: str, material_b64: str) -> None:
        """ImportKeyPair's public key, for the instances launched with that key pair."""
        try:
            line = base64.b64decode(material_b64).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            return
        with self._lock:
            self._keys[name] = line

    def boot(
        self, instance_id: str, ip: str, user_data_b64: str, key_name: str, image: str = ""
    ) -> None:
        """Boot the instance's VM at ``ip`` (detached; running after the boot delay)."""
        if ipaddress.ip_address(ip) not in self.subnet:
            log.warning("ec2vms.skip instance=%s ip=%s: not on the lab bridge", instance_id, ip)
            return
        try:
            user_data = base64.b64decode(user_data_b64).decode() if user_data_b64 else None
        except (binascii.Error, UnicodeDecodeError):
            user_data = None
        with self._lock:
            key = self._keys.get(key_name, "")
        short = instance_id.removeprefix("i-")[:12]
        spec = vm.VmSpec(
            id=instance_id,
            hostname="ip-" + ip.replace(".", "-"),  # EC2's own name for it
            netns=self.netns_of(instance_id).name,  # the lab's VM networks, swept by `lab down`
            host_if=f"sbv{short}",
            bridge=self.bridge,
            address=f"{ip}/{self.subnet.prefixlen}",
            gateway=self.gateway,
            boot_delay=self.boot_delay,
            hide=self.hide,
            authorized_keys=(key,) if key else (),
            root=images(self.state_dir).get(image, ""),
            binds=binds_of(self.state_dir).get(image, ()),
        )
        vmdir = self.state_dir / "vms" / instance_id
        self.ensure_network()
        pid, start = vm.boot(vmdir, spec, user_data)
        vm.write_json_atomic(vmdir / "meta.json", {"launcher_pid": pid, "launcher_start": start})
        log.info("ec2vms.boot instance=%s ip=%s", instance_id, ip)

    @staticmethod
    def netns_of(instance_id: str) -> Path:
        """The instance's VM's network namespace (its file, once the VM has made it)."""
        return net.NETNS_DIR / f"sbl-ns-{instance_id.removeprefix('i-')[:12]}"

    def console(self, instance_id: str) -> str | None:
        """The VM's console so far; None for an instance that has no VM."""
        try:
            return (self.state_dir / "vms" / instance_id / "console.log").read_text(
                errors="replace"
            )
        except (FileNotFoundError, NotADirectoryError):
            return None

    def halt(self, instance_id: str) -> None:
        halt(self.state_dir / "vms" / instance_id)

    def halt_all(self) -> None:
        """Every VM this emulator booted (``lab down``)."""
        halt_all(self.state_dir)


def images(state_dir: Path) -> dict[str, str]:
    """AMI -> root file system the instances of that AMI boot (none: the host's)."""
    try:
        data = json.loads((state_dir / "images.json").read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def register_image(
    state_dir: str | Path, ami: str, root: str | Path | None, binds: tuple[str, ...] = ()
) -> None:
    """Instances of ``ami`` boot ``root`` from now on (None: the host's file system), with
    ``binds`` (host directories, at the same paths: the lab's shared directory)."""
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    known = images(state)
    bound = binds_of(state)
    known.pop(ami, None)
    bound.pop(ami, None)
    if root is not None:
        known[ami] = str(root)
        if binds:
            bound[ami] = tuple(binds)
    vm.write_json_atomic(state / "images.json", known)
    vm.write_json_atomic(state / "image-binds.json", {k: list(v) for k, v in bound.items()})


def binds_of(state_dir: Path) -> dict[str, tuple[str, ...]]:
    """AMI -> the host directories bound into its instances (image-based ones only)."""
    try:
        data = json.loads((state_dir / "image-binds.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): tuple(str(p) for p in v) for k, v in data.items() if isinstance(v, list)}


def halt(vmdir: Path) -> None:
    """Stop one instance's VM, its network with it, and remove its directory."""
    try:
        meta = json.loads((vmdir / "meta.json").read_text())
    except (OSError, ValueError):
        return
    vm.halt(vmdir, meta.get("launcher_pid"), meta.get("launcher_start"))  # and its network
    shutil.rmtree(vmdir, ignore_errors=True)
    log.info("ec2vms.halt instance=%s", vmdir.name)


def halt_all(state_dir: Path) -> None:
    """Every VM booted under ``state_dir`` (also what a dead emulator left)."""
    vms = state_dir / "vms"
    for d in sorted(vms.iterdir()) if vms.is_dir() else []:
        halt(d)
