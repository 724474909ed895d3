"""``NamespaceNodeDriver``: a libcloud compute driver whose VMs are Linux namespaces.

It behaves like a small public cloud: a catalogue of sizes (with GPU count and
list price in ``extra``), one image ("host": the host's own filesystem seen
through the VM's namespaces, or the root filesystem the lab points it at with
``ex_set_host_image``: another Slurm release's image), an asynchronous ``create_node`` (pending ->
running after the boot delay), user-data run at boot, an SSH host key the
provider reports (``extra["ssh_host_key"]`` and the cloud-init block in
``ex_get_console_output``), idempotency tokens like EC2's ClientToken, and
terminated instances that stay listed for ``forget_after`` seconds (EC2: about an
hour), then are forgotten. State lives under ``state_dir``; all
mutations hold an exclusive lock on it, so several processes can share it.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from libcloud.common.types import LibcloudError
from libcloud.compute.base import (
    Node,
    NodeAuthSSHKey,
    NodeDriver,
    NodeImage,
    NodeLocation,
    NodeSize,
)
from libcloud.compute.types import NodeState

from slurm_burst.adapters.filelock import locked
from slurm_burst.adapters.proc import alive
from slurm_burst_lab import simnvml
from slurm_burst_lab.nscloud import net, vm

# name: (cpus, ram MB, gpus, list price per hour)
SIZES: dict[str, tuple[int, int, int, float]] = {
    "ns.cpu2": (2, 1000, 0, 0.085),
    "ns.cpu4": (4, 2000, 0, 0.17),
    "ns.gpu1": (2, 1000, 2, 2.50),
    "ns.gpu4": (8, 4000, 4, 9.80),
}
IMAGES = {"host": "the host's filesystem, private /etc /var /root /run per VM"}
FIRST_HOST = 10  # .1 is the gateway; keep a few low addresses for the lab's own use


class NamespaceNodeDriver(NodeDriver):
    type = "nscloud"
    name = "Namespace cloud (slurm-burst lab)"
    website = "https://github.com/slurm-burst"
    features = {"create_node": ["ssh_key"]}

    def __init__(
        self,
        key: str = "lab",
        secret: str | None = None,
        secure: bool = False,
        host: str | None = None,
        port: int | None = None,
        region: str = "lab-1",
        state_dir: str = "/var/lib/slurm-burst-lab/cloud",
        bridge: str = "sbl-inet",
        subnet: str = "10.251.0.0/24",
        boot_delay: float = 2.0,
        hide: tuple[str, ...] | list[str] = (),
        gpu_dir: str = "/run/simgpu",
        nvml_library: str = "",
        forget_after: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        self.key = key
        self.region = region
        self.state_dir = Path(state_dir)
        self.bridge = bridge
        self.subnet = ipaddress.ip_network(subnet)
        self.gateway = next(self.subnet.hosts())
        self.boot_delay = float(boot_delay)
        self.hide = (*vm.DEFAULT_HIDE, str(self.state_dir), *hide)
        self.gpu_dir = gpu_dir
        self.nvml_library = nvml_library  # the simulated NVML a GPU size's VM gets
        self.forget_after = float(forget_after)
        # NodeDriver.__init__ would build an HTTP connection; there is none to build.

    # -- catalogue ----------------------------------------------------------
    def list_sizes(self, location: NodeLocation | None = None) -> list[NodeSize]:
        return [
            NodeSize(
                id=n,
                name=n,
                ram=ram,
                disk=0,
                bandwidth=None,
                price=price,
                driver=self,
                extra={"cpus": cpus, "gpus": gpus, "price_per_hour": price},
            )
            for n, (cpus, ram, gpus, price) in SIZES.items()
        ]

    def list_images(
        self, location: NodeLocation | None = None, ex_only_active: bool = True
    ) -> list[NodeImage]:
        extra = {"root": self._host_image().get("root", "/")}
        return [
            NodeImage(id=i, name=i, driver=self, extra={"description": d, **extra})
            for i, d in IMAGES.items()
        ]

    def ex_set_host_image(
        self, root: str | None, binds: tuple[str, ...] = (), init: str = "vminit"
    ) -> None:
        """Boot the "host" image's VMs from ``root`` (a root filesystem) with ``binds``
        (host directories, same paths inside) and ``init`` ("systemd": the image's own
        systemd as PID 1); None: from the host's own filesystem."""
        path = self.state_dir / "image.json"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if root is None:
            path.unlink(missing_ok=True)
        else:
            vm.write_json_atomic(path, {"root": root, "binds": list(binds), "init": init})

    def _host_image(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.state_dir / "image.json").read_text()))
        except (OSError, ValueError):
            return {}

    def list_locations(self) -> list[NodeLocation]:
        return [NodeLocation(id=self.region, name=self.region, country="lab", driver=self)]

    # -- lifecycle ------------------------------------------------------------
    def create_node(  # type: ignore[override]  # narrower auth, extra ex_ arguments
        self,
        name: str,
        size: NodeSize,
        image: NodeImage,
        location: NodeLocation | None = None,
        auth: NodeAuthSSHKey | None = None,
        ex_userdata: str | None = None,
        ex_metadata: dict[str, str] | None = None,
        ex_token: str | None = None,
        ex_gpu_state: dict[str, str | int] | None = None,
        **kwargs: Any,
    ) -> Node:
        """Start a VM; returns at once with the node ``pending`` (like a real cloud).

        A GPU size's VM has its GPUs' device files and, with ``nvml_library``, the
        simulated NVML with healthy GPUs, changed by ``ex_gpu_state`` (the lab's GPU
        faults: ``simnvml.FAULTS``)."""
        if size.id not in SIZES:
            raise LibcloudError(f"InvalidParameterValue: unknown size {size.id!r}", driver=self)
        if image.id not in IMAGES:
            raise LibcloudError(f"InvalidAMIID.NotFound: unknown image {image.id!r}", driver=self)
        if not name or len(name) > 63 or not all(c.isalnum() or c in "-." for c in name):
            raise LibcloudError(f"InvalidParameterValue: bad instance name {name!r}", driver=self)
        with self._locked():
            if ex_token:
                for meta in self._all_meta():
                    if meta.get("token") == ex_token:
                        return self._to_node(meta)
            vm_id = "ns-" + secrets.token_hex(6)
            image_root = self._host_image()
            address = self._free_address()
            spec = vm.VmSpec(
                id=vm_id,
                hostname=name,
                netns=f"sbl-{vm_id}",
                host_if=f"sbv{vm_id[3:]}",
                bridge=self.bridge,
                address=f"{address}/{self.subnet.prefixlen}",
                gateway=str(self.gateway),
                boot_delay=self.boot_delay,
                hide=self.hide,
                authorized_keys=(auth.pubkey.strip(),) if auth is not None else (),
                extra_files=self._gpu_files(SIZES[size.id][2], ex_gpu_state),
                nvml_library=self.nvml_library if SIZES[size.id][2] else "",
                root=str(image_root.get("root", "")),
                binds=tuple(image_root.get("binds", ())),
                init=str(image_root.get("init", "vminit")),
            )
            self.ex_ensure_network()
            meta = {
                "id": vm_id,
                "name": name,
                "size": size.id,
                "image": image.id,
                "ip": str(address),
                "token": ex_token,
                "tags": dict(ex_metadata or {}),
                "created_at": time.time(),
                "state": "pending",
                "region": self.region,
            }
            vmdir = self.state_dir / "vms" / vm_id
            vmdir.mkdir(parents=True)
            self._write_meta(meta)
            pid, start = vm.boot(vmdir, spec, ex_userdata)
            meta.update(launcher_pid=pid, launcher_start=start)
            self._write_meta(meta)
        return self._to_node(meta)

    def _gpu_files(self, gpus: int, changes: dict[str, str | int] | None) -> dict[str, str]:
        """A GPU VM's (simulated) device files, as gres.conf expects, and NVML's state."""
        files = {f"{self.gpu_dir}/nvidia{i}": "" for i in range(gpus)}
        if gpus and self.nvml_library:
            files.update(simnvml.vm_files(gpus, changes))
        return files

    def ex_set_gpu_state(self, node: Node, changes: dict[str, str | int]) -> None:
        """Change a running GPU VM's simulated GPUs (utilization, a new fault...): what
        NVML reports from its next nvmlInit on, and the VM's kernel log (XIDs)."""
        meta = self._read_meta(str(node.id))
        if meta is None:
            raise LibcloudError(f"InvalidInstanceID.NotFound: {node.id}", driver=self)
        for path, text in simnvml.vm_files(SIZES[meta["size"]][2], changes).items():
            subprocess.run(
                [*self.ex_enter_argv(node), "tee", path],
                input=text, text=True, capture_output=True, check=True, timeout=10,
            )  # fmt: skip

    def list_nodes(
        self, ex_node_ids: list[str] | None = None, ex_filters: dict[str, str] | None = None
    ) -> list[Node]:
        """Every instance, terminated ones included until they are forgotten;
        ``ex_filters`` matches tags (tag:KEY)."""
        nodes = []
        for meta in self._forget_terminated(self._all_meta()):
            if ex_node_ids is not None and meta["id"] not in ex_node_ids:
                continue
            if ex_filters and any(
                meta["tags"].get(k.removeprefix("tag:")) != v for k, v in ex_filters.items()
            ):
                continue
            nodes.append(self._to_node(meta))
        return nodes

    def destroy_node(self, node: Node) -> bool:
        """Stop the VM and release everything it held; terminating twice is fine."""
        with self._locked():
            meta = self._read_meta(str(node.id))
            if meta is None:
                raise LibcloudError(f"InvalidInstanceID.NotFound: {node.id}", driver=self)
            if meta["state"] == "terminated":
                return True
            vmdir = self.state_dir / "vms" / str(node.id)
            vm.halt(vmdir, meta.get("launcher_pid"), meta.get("launcher_start"))
            status = vm.read_status(vmdir)
            for entry in vmdir.iterdir():
                if entry.name != "meta.json":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            meta.update(
                state="terminated",
                terminated_at=time.time(),
                ssh_host_key=status.get("ssh_host_key"),
            )
            self._write_meta(meta)
        return True

    def ex_create_tags(self, node: Node, tags: dict[str, str]) -> bool:
        """Add (or change) tags of an instance, as EC2's CreateTags does."""
        with self._locked():
            meta = self._read_meta(str(node.id))
            if meta is None:
                raise LibcloudError(f"InvalidInstanceID.NotFound: {node.id}", driver=self)
            meta["tags"] = {**meta.get("tags", {}), **tags}
            self._write_meta(meta)
        return True

    def ex_ensure_network(self) -> None:
        """Create the cloud's 'internet' bridge with the gateway address (idempotent)."""
        net.ensure_bridge(self.bridge, f"{self.gateway}/{self.subnet.prefixlen}")

    def reboot_node(self, node: Node) -> bool:
        raise LibcloudError("reboot is not supported by the namespace cloud", driver=self)

    def ex_get_console_output(self, node: Node) -> str:
        """The VM's console (launcher and init messages, SSH host key block)."""
        try:
            return (self.state_dir / "vms" / str(node.id) / "console.log").read_text(
                errors="replace"
            )
        except FileNotFoundError:
            return ""

    def ex_enter_argv(self, node: Node) -> list[str]:
        """argv prefix running a command inside the VM; for the lab and its tests only."""
        return vm.enter_argv(self._launcher_pid(node))

    def _launcher_pid(self, node: Node) -> int:
        """The pid of ``node``'s VM launcher, which must be running."""
        meta = self._read_meta(str(node.id))
        if meta is None or not alive(meta.get("launcher_pid"), meta.get("launcher_start")):
            raise LibcloudError(f"{node.id} is not running", driver=self)
        return int(meta["launcher_pid"])

    def ex_export_root(self, node: Node, dest: str | Path) -> Path:
        """Copy a running VM's root file system (its own, not what is mounted below it:
        /proc, /sys, /dev, /run, binds) to ``dest``, which must not exist: how the lab
        bakes an image from a VM a provisioning tool prepared (a cloud's CreateImage)."""
        pid1 = vm.init_pid(self._launcher_pid(node))
        if pid1 is None:
            raise LibcloudError(f"{node.id} has no init process", driver=self)
        out = Path(dest)
        out.mkdir(parents=True)
        with tempfile.TemporaryFile() as errors:
            pack = subprocess.Popen(
                ["tar", "--one-file-system", "--numeric-owner", "--xattrs", "-C",
                 f"/proc/{pid1}/root", "-cf", "-", "."],
                stdout=subprocess.PIPE, stderr=errors,
            )  # fmt: skip
            assert pack.stdout is not None
            unpack = subprocess.run(
                ["tar", "--numeric-owner", "--xattrs", "-C", str(out), "-xf", "-"],
                stdin=pack.stdout, capture_output=True, check=False, timeout=600,
            )  # fmt: skip
            pack.stdout.close()
            # tar's 1: a file changed while it was read (a running system's logs), as a
            # cloud's snapshot of a running instance's disk takes it
            packed = pack.wait(timeout=600)
            errors.seek(0)
            why = (errors.read() + unpack.stderr).decode(errors="replace").strip()
        if packed not in (0, 1) or unpack.returncode != 0:
            shutil.rmtree(out, ignore_errors=True)
            raise LibcloudError(
                f"exporting {node.id}'s root failed (tar {packed}/{unpack.returncode}): {why}",
                driver=self,
            )
        return out

    def ex_teardown(self, every_vm_network: bool = False) -> None:
        """Destroy every VM, the bridge and the state directory: leave nothing behind.

        Only this cloud's VM networks (named after the VM ids in its own state
        directory), so that a test's own cloud leaves the lab's alone; the lab, which
        owns the names on this host, passes ``every_vm_network`` to sweep them all."""
        vms = self.state_dir / "vms"
        ours = {d.name for d in vms.iterdir()} if vms.is_dir() else set()
        for node in self.list_nodes():
            self.destroy_node(node)
        for ns in net.list_netns("sbl-ns-"):
            if every_vm_network or ns.removeprefix("sbl-") in ours:
                net.delete_guest_network(ns, "sbv" + ns.removeprefix("sbl-ns-"))
        net.delete_link(self.bridge)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    # -- internals ----------------------------------------------------------
    def _locked(self) -> AbstractContextManager[None]:
        return locked(self.state_dir)

    def _forget_terminated(self, metas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``metas`` without the instances terminated more than ``forget_after`` seconds
        ago, whose records are deleted, as EC2 forgets them: a listing must not grow with
        every instance the cloud ever made."""
        now = time.time()
        stale = {
            m["id"]
            for m in metas
            if m["state"] == "terminated"
            and now - float(m.get("terminated_at") or now) > self.forget_after
        }
        if not stale:
            return metas
        with self._locked():
            for vm_id in stale:
                meta = self._read_meta(vm_id)
                if meta is not None and meta["state"] == "terminated":
                    shutil.rmtree(self.state_dir / "vms" / vm_id, ignore_errors=True)
        return [m for m in metas if m["id"] not in stale]

    def _all_meta(self) -> list[dict[str, Any]]:
        vms = self.state_dir / "vms"
        if not vms.is_dir():
            return []
        out = []
        for d in sorted(vms.iterdir()):
            meta = self._read_meta(d.name)
            if meta is not None:
                out.append(meta)
        return out

    def _read_meta(self, vm_id: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads((self.state_dir / "vms" / vm_id / "meta.json").read_text()))
        except (OSError, ValueError):
            return None

    def _write_meta(self, meta: dict[str, Any]) -> None:
        vm.write_json_atomic(self.state_dir / "vms" / meta["id"] / "meta.json", meta)

    def _free_address(self) -> str:
        used = {m["ip"] for m in self._all_meta() if m["state"] != "terminated"}
        for i, host in enumerate(self.subnet.hosts()):
            if i + 1 >= FIRST_HOST and str(host) not in used:
                return str(host)
        raise LibcloudError(
            f"InsufficientFreeAddressesInSubnet: no free address in {self.subnet}", driver=self
        )

    def _to_node(self, meta: dict[str, Any]) -> Node:
        """The one place provider state becomes a libcloud Node."""
        vmdir = self.state_dir / "vms" / meta["id"]
        status = vm.read_status(vmdir) if meta["state"] != "terminated" else {}
        if meta["state"] == "terminated":
            state = NodeState.TERMINATED
        elif not alive(meta.get("launcher_pid"), meta.get("launcher_start")) and meta.get(
            "launcher_pid"
        ):
            state = NodeState.ERROR
        elif status.get("state") == "running":
            state = NodeState.RUNNING
        elif status.get("state") in ("failed", "stopped", "stopping"):
            state = NodeState.ERROR
        else:
            state = NodeState.PENDING
        extra = {
            "size": meta["size"],
            "image": meta["image"],
            "tags": meta["tags"],
            "region": meta["region"],
            "created_at": meta["created_at"],
            "terminated_at": meta.get("terminated_at"),
            "token": meta.get("token"),
            "ssh_host_key": status.get("ssh_host_key") or meta.get("ssh_host_key"),
            "userdata_exit": status.get("userdata_exit"),
            "error": status.get("error"),
        }
        ips = [meta["ip"]] if state != NodeState.TERMINATED else []
        return Node(
            id=meta["id"],
            name=meta["name"],
            state=state,
            public_ips=ips,
            private_ips=ips,
            driver=self,
            size=None,
            image=None,
            extra=extra,
        )


# -- what the product's extension points call (slurm_burst_lab.plugin.NSCLOUD) -----------
def construct(cls: type, provider: Any, options: dict[str, Any]) -> Any:
    """The driver of a provider profile with ``driver = "nscloud"``: its options, and its
    region (no credentials: the namespace cloud is this machine)."""
    if provider.region:
        options["region"] = provider.region
    return cls("lab", **options)


def launch_args(
    driver: Any, spec: Any, placement: Any, size: Any, tags: Mapping[str, str]
) -> dict[str, Any]:
    """create_node's arguments for one launch (profiles.Builder)."""
    return {
        "name": spec.node,
        "size": size,
        "image": NodeImage(id=spec.image, name=spec.image, driver=driver),
        "auth": NodeAuthSSHKey(spec.ssh_public_key),
        "ex_userdata": spec.user_data,
        "ex_metadata": dict(tags),
        "ex_token": spec.token,
    }
