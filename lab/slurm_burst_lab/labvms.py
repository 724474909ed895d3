"""An emulated cloud's instances as namespace VMs (the lab's VM machinery), opt-in.

With booting on (``python -m slurm_burst_lab.ec2emu PORT --boot ...`` or
``python -m slurm_burst_lab.gceemu PORT --boot ...``, as ``lab up`` starts them), each
instance the emulator makes boots as a VM on the lab's cloud bridge: its address is the
instance's private IP (a range the emulator owns on the bridge), it runs the launch's
user-data (EC2) or startup script (GCE), root's authorized keys are the launch's (EC2's
key pair, GCE's ``ssh-keys`` metadata), and its console, with the host-key block, is
what the emulator serves (EC2's GetConsoleOutput; GCE's serial port, and the guest
attributes its guest environment would publish). Deleting the instance halts it.
An instance boots the host's own file system, or, for an image that
``state_dir/images.json`` maps to a root file system (``{"ami-…": "/path"}``; see
:func:`register_image`), that image through a private overlay.
Without booting, the emulators stay API-only (the 1,000-instance benchmarks).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import shutil
from pathlib import Path

from slurm_burst_lab.nscloud import net, vm

log = logging.getLogger(__name__)


class LabVms:
    """Namespace VMs for an emulator's instance ids, under ``state_dir/vms/<instance id>``;
    ``subnet`` is the bridge's, ``gateway`` its host address (default: the subnet's first)."""

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

    def ensure_network(self) -> None:
        net.ensure_bridge(self.bridge, f"{self.gateway}/{self.subnet.prefixlen}")

    def boot(
        self,
        instance_id: str,
        ip: str,
        user_data: str | None,
        authorized_keys: tuple[str, ...],
        image: str = "",
        hostname: str = "",
    ) -> None:
        """Boot the instance's VM at ``ip`` (detached; running after the boot delay)."""
        if ipaddress.ip_address(ip) not in self.subnet:
            log.warning("labvms.skip instance=%s ip=%s: not on the lab bridge", instance_id, ip)
            return
        short = self.short(instance_id)
        spec = vm.VmSpec(
            id=instance_id,
            hostname=hostname or "ip-" + ip.replace(".", "-"),  # EC2's own name for it
            netns=self.netns_of(instance_id).name,  # the lab's VM networks, swept by `lab down`
            host_if=f"sbv{short}",
            bridge=self.bridge,
            address=f"{ip}/{self.subnet.prefixlen}",
            gateway=self.gateway,
            boot_delay=self.boot_delay,
            hide=self.hide,
            authorized_keys=authorized_keys,
            root=images(self.state_dir).get(image, ""),
            binds=binds_of(self.state_dir).get(image, ()),
        )
        vmdir = self.state_dir / "vms" / instance_id
        self.ensure_network()
        pid, start = vm.boot(vmdir, spec, user_data)
        vm.write_json_atomic(vmdir / "meta.json", {"launcher_pid": pid, "launcher_start": start})
        log.info("labvms.boot instance=%s ip=%s", instance_id, ip)

    @staticmethod
    def short(instance_id: str) -> str:
        """Twelve characters that tell the instance's VM apart: EC2's id after ``i-``, the
        last twelve digits of GCE's (its ids count up from one large number)."""
        if instance_id.startswith("i-"):
            return instance_id[2:14]
        return instance_id[-12:]

    @classmethod
    def netns_of(cls, instance_id: str) -> Path:
        """The instance's VM's network namespace (its file, once the VM has made it)."""
        return net.NETNS_DIR / f"sbl-ns-{cls.short(instance_id)}"

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
    """Image (EC2's AMI, GCE's image name) -> root file system its instances boot (none:
    the host's)."""
    try:
        data = json.loads((state_dir / "images.json").read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def register_image(
    state_dir: str | Path, image: str, root: str | Path | None, binds: tuple[str, ...] = ()
) -> None:
    """Instances of ``image`` boot ``root`` from now on (None: the host's file system), with
    ``binds`` (host directories, at the same paths: the lab's shared directory)."""
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    known = images(state)
    bound = binds_of(state)
    known.pop(image, None)
    bound.pop(image, None)
    if root is not None:
        known[image] = str(root)
        if binds:
            bound[image] = tuple(binds)
    vm.write_json_atomic(state / "images.json", known)
    vm.write_json_atomic(state / "image-binds.json", {k: list(v) for k, v in bound.items()})


def binds_of(state_dir: Path) -> dict[str, tuple[str, ...]]:
    """Image -> the host directories bound into its instances (image-based ones only)."""
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
    log.info("labvms.halt instance=%s", vmdir.name)


def halt_all(state_dir: Path) -> None:
    """Every VM booted under ``state_dir`` (also what a dead emulator left)."""
    vms = state_dir / "vms"
    for d in sorted(vms.iterdir()) if vms.is_dir() else []:
        halt(d)
