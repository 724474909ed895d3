"""PID 1 of a namespace VM: give it a private disk, a host key, sshd, and run user-data.

Inside fresh mount/UTS/PID/time namespaces (see launcher.py) it:

1. sets the hostname;
2. mounts tmpfs on /run and /tmp and an overlay (upper layer in the VM's own
   tmpfs) on /etc, /var/lib, /var/log, /root and /home, so the VM sees the host's
   files as its image but every write stays private; or, for a VM booted from an
   image (``VmSpec.root``), an overlay of that image becomes its root (vminit
   itself moves in) with /proc, /dev, /sys and the shared directories bound in;
3. hides what a VM must never see (munge key, WireGuard and SSH keys, the lab's
   and the cloud's state) under empty tmpfs, and deletes the host's SSH host keys
   from its /etc overlay;
4. makes a fresh SSH host key, prints it to the console the way cloud-init does,
   and starts sshd on the VM's address;
5. runs the user-data as root (as cloud-init would) with output in
   /var/log/cloud-init-output.log;
6. reaps orphans and restarts sshd until SIGTERM, then stops every process.

Progress goes to ``status.json`` through a directory fd opened before the VM's
own mounts hide the host path.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm_burst_lab.nscloud.vm import VmSpec, read_spec, write_private

OVERLAID = ("/etc", "/var/lib", "/var/log", "/root", "/home")
DISK = "/run/.vmdisk"


class VmInit:
    def __init__(self, vmdir: Path) -> None:
        self.spec: VmSpec = read_spec(vmdir)
        self.dirfd = os.open(vmdir, os.O_RDONLY | os.O_DIRECTORY)
        self.stopping = False
        self.sshd: subprocess.Popen[bytes] | None = None
        self.status: dict[str, Any] = {"state": "booting"}

    # -- status -------------------------------------------------------------
    def write_status(self, **changes: Any) -> None:
        self.status.update(changes)
        data = json.dumps(self.status, indent=1, sort_keys=True).encode()
        fd = os.open(
            "status.json.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self.dirfd
        )
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace("status.json.tmp", "status.json", src_dir_fd=self.dirfd, dst_dir_fd=self.dirfd)

    def read_private(self, name: str) -> str | None:
        try:
            fd = os.open(name, os.O_RDONLY, dir_fd=self.dirfd)
        except FileNotFoundError:
            return None
        with os.fdopen(fd) as fh:
            return fh.read()

    # -- boot ---------------------------------------------------------------
    def boot(self) -> None:
        socket.sethostname(self.spec.hostname)
        if self.spec.init == "systemd":
            self.boot_systemd()  # does not return: systemd becomes PID 1
        userdata = self.read_private("user-data")
        # read while the host's path is visible (the lab's state is hidden below)
        nvml = Path(self.spec.nvml_library).read_bytes() if self.spec.nvml_library else b""
        mount(["-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", "/run"])
        if self.spec.root:
            self.enter_image()
            mount(["-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", "/run"])
        mount(["-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/tmp"])
        for top in () if self.spec.root else OVERLAID:  # an image's root is private already
            if not os.path.isdir(top):
                continue
            layer = f"{DISK}{top.replace('/', '_')}"
            os.makedirs(f"{layer}/upper", mode=0o755)
            os.makedirs(f"{layer}/work", mode=0o700)
            mount(
                [
                    "-t",
                    "overlay",
                    "overlay",
                    "-o",
                    f"lowerdir={top},upperdir={layer}/upper,workdir={layer}/work",
                    top,
                ]
            )
            if mount_type(top) != "overlay":
                raise RuntimeError(f"{top} is not an overlay after mounting it")
        for path in self.spec.hide:
            if os.path.isdir(path):
                # empty, so nothing to protect: 0755 lets daemons such as munged
                # (not root) reach what the VM itself creates below it
                mount(["-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", path])
        self.write_hosts()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        if self.spec.fresh_host_keys:
            self.new_host_key()
        for path, content in self.spec.extra_files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Path(path).write_text(content)
        if nvml:
            self.install_nvml(nvml)
        self.write_authorized_keys()
        self.start_sshd()
        self.write_running()
        if userdata:
            self.run_userdata(userdata)

    def install_nvml(self, library: bytes) -> None:
        """The GPU driver's library, where this VM's loader finds it (libnvidia-ml.so.1 by
        name, as nvidia-ml-py asks): a file in /run and an ld.so.conf.d entry, with the
        loader's cache rebuilt; /etc is the VM's own, never the host's."""
        if mount_type("/" if self.spec.root else "/etc") != "overlay":
            raise RuntimeError("refusing to touch /etc/ld.so.conf.d: /etc is not the VM's overlay")
        os.makedirs("/run/simgpu/lib", mode=0o755, exist_ok=True)
        lib = "/run/simgpu/lib/libnvidia-ml.so.1"
        Path(lib).write_bytes(library)
        os.chmod(lib, 0o755)  # noqa: S103  # a shared library, as a driver installs it
        os.makedirs("/etc/ld.so.conf.d", exist_ok=True)
        Path("/etc/ld.so.conf.d/zz-simnvml.conf").write_text("/run/simgpu/lib\n")
        subprocess.run(["/sbin/ldconfig"], check=True, timeout=60)

    def enter_image(self) -> None:
        """Make a private overlay of the image this VM's root, with /proc (this VM's),
        /dev, /sys and the spec's shared directories bound in, and move in: every
        process the VM starts from here on sees the image's files, not the host's."""
        root = self.image_overlay(f"{DISK}_image")
        for src, how in (("/proc", "--bind"), ("/dev", "--rbind"), ("/sys", "--rbind")):
            mount([how, src, root + src])
        self.move_in(root)

    def image_overlay(self, top: str) -> str:
        """A private overlay of the spec's image (upper layer under ``top``, in this VM's
        tmpfs); returns where it is mounted."""
        root = f"{top}/root"
        for d, mode in (("upper", 0o755), ("work", 0o700), ("root", 0o755)):
            os.makedirs(f"{top}/{d}", mode=mode)
        opts = f"lowerdir={self.spec.root},upperdir={top}/upper,workdir={top}/work"
        mount(["-t", "overlay", "overlay", "-o", opts, root])
        return root

    def move_in(self, root: str) -> None:
        """Bind the spec's shared directories into ``root`` (same paths), then make it
        this process's root."""
        for path in self.spec.binds:
            os.makedirs(root + path, exist_ok=True)
            mount(["--bind", path, root + path])
        os.chroot(root)
        os.chdir("/")

    def write_authorized_keys(self) -> None:
        if self.spec.authorized_keys:
            os.makedirs("/root/.ssh", mode=0o700, exist_ok=True)
            write_private(
                "/root/.ssh/authorized_keys", "\n".join(self.spec.authorized_keys) + "\n", 0o600
            )

    def boot_systemd(self) -> None:
        """Boot the image's systemd as this VM's PID 1, as a container manager would: a
        private overlay of the image as root, its own /proc, a read-only /sys, the VM's
        cgroup (the launcher made it; this is a cgroup namespace) mounted where systemd
        looks, a private /dev with the few devices a host needs, /dev/net/tun for
        WireGuard. The hostname, /etc/hosts, a fresh SSH host key (printed as cloud-init
        would) and root's authorized keys are written first; then vminit execs systemd,
        which starts sshd like on any Debian host."""
        mount(["-t", "tmpfs", "-o", "mode=0700", "tmpfs", "/run"])
        root = self.image_overlay(f"{DISK}_systemd")
        mount(["-t", "proc", "proc", f"{root}/proc"])
        mount(["-t", "sysfs", "-o", "ro,nosuid,nodev,noexec", "sysfs", f"{root}/sys"])
        cg = f"{root}/sys/fs/cgroup"
        mount(["-t", "tmpfs", "-o", "mode=0755,nosuid,nodev,noexec", "tmpfs", cg])
        os.makedirs(f"{cg}/systemd")
        os.makedirs(f"{cg}/unified")
        mount(["-t", "cgroup", "-o", "none,name=systemd,nosuid,nodev,noexec", "cgroup",
               f"{cg}/systemd"])  # fmt: skip
        mount(["-t", "cgroup2", "-o", "nosuid,nodev,noexec", "cgroup2", f"{cg}/unified"])
        dev = f"{root}/dev"
        mount(["-t", "tmpfs", "-o", "mode=0755,nosuid", "tmpfs", dev])
        for name in ("null", "zero", "full", "random", "urandom", "tty", "net/tun"):
            os.makedirs(os.path.dirname(f"{dev}/{name}"), exist_ok=True)
            Path(f"{dev}/{name}").touch()
            mount(["--bind", f"/dev/{name}", f"{dev}/{name}"])
        for d in ("pts", "shm"):
            os.makedirs(f"{dev}/{d}")
        mount(["-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=0620", "devpts",
               f"{dev}/pts"])  # fmt: skip
        os.symlink("pts/ptmx", f"{dev}/ptmx")
        mount(["-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", f"{dev}/shm"])
        self.move_in(root)
        Path("/etc/hostname").write_text(self.spec.hostname + "\n")
        # this machine's own id (the image has none), as a cloud image's first boot makes
        # it: without one systemd would run its first-boot wizard and fail it
        Path("/etc/machine-id").write_text(os.urandom(16).hex() + "\n")
        self.write_hosts()
        self.new_host_key()
        self.write_authorized_keys()
        self.write_running(init="systemd")
        os.close(self.dirfd)
        env = {"container": "slurm-burst-lab", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        os.execve("/lib/systemd/systemd", ["/lib/systemd/systemd"], env)

    def write_running(self, **extra: Any) -> None:
        """The status that says the VM is up: when, at which address, its SSH host key."""
        self.write_status(
            state="running",
            booted_at=time.time(),
            ip=self.spec.ip,
            ssh_host_key=self.status.get("ssh_host_key"),
            **extra,
        )

    def write_hosts(self) -> None:
        """Name -> address in /etc/hosts, as cloud-init's manage_etc_hosts does: daemons
        such as munged resolve their own hostname and must not wait on unreachable DNS."""
        hosts = Path("/etc/hosts")
        lines = (
            [
                ln
                for ln in hosts.read_text().splitlines()
                if self.spec.hostname not in ln.split()[1:]
            ]
            if hosts.exists()
            else []
        )
        if not any("localhost" in ln.split()[1:] for ln in lines if not ln.startswith("#")):
            # an image with no /etc/hosts (mmdebstrap writes none): what every host has
            lines[:0] = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines.append(f"{self.spec.ip}\t{self.spec.hostname}")
        hosts.write_text("\n".join(lines) + "\n")
        # no DNS server answers inside the lab's networks: without one named, a lookup
        # that /etc/hosts cannot answer fails at once instead of timing out (slurmd 24.11
        # spent 10 s starting and 20 s launching each job on the host's unreachable one)
        Path("/etc/resolv.conf").unlink(missing_ok=True)
        Path("/etc/resolv.conf").write_text(
            "# the lab's VMs have no DNS: names come from /etc/hosts\n"
        )

    def new_host_key(self) -> None:
        # Only ever inside our own /etc overlay: checked above, deleted in the upper layer.
        if mount_type("/" if self.spec.root else "/etc") != "overlay":
            raise RuntimeError("refusing to touch /etc/ssh: /etc is not the VM's overlay")
        for name in os.listdir("/etc/ssh"):
            if name.startswith("ssh_host_"):
                os.unlink(f"/etc/ssh/{name}")
        key = "/etc/ssh/ssh_host_ed25519_key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.spec.hostname, "-f", key],
            check=True,
            stdin=subprocess.DEVNULL,
        )
        pub = Path(key + ".pub").read_text().strip()
        print(
            "-----BEGIN SSH HOST KEY KEYS-----",
            pub,
            "-----END SSH HOST KEY KEYS-----",
            sep="\n",
            flush=True,
        )
        self.status["ssh_host_key"] = pub

    def start_sshd(self) -> None:
        log = open("/var/log/sshd.log", "ab")  # noqa: SIM115 - owned by the child
        self.sshd = subprocess.Popen(
            [
                "/usr/sbin/sshd",
                "-D",
                "-e",
                "-h",
                "/etc/ssh/ssh_host_ed25519_key",
                "-o",
                f"ListenAddress={self.spec.ip}",
                "-o",
                "PermitRootLogin=prohibit-password",
                "-o",
                "PasswordAuthentication=no",
                "-o",
                "KbdInteractiveAuthentication=no",
                "-o",
                "UsePAM=no",
                "-o",
                "PidFile=/run/sshd.pid",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()

    def run_userdata(self, userdata: str) -> None:
        os.makedirs("/run/cloud-init", mode=0o700, exist_ok=True)
        script = "/run/cloud-init/user-data"
        write_private(script, userdata, 0o700)
        argv = [script] if userdata.startswith("#!") else ["/bin/sh", script]
        with open("/var/log/cloud-init-output.log", "ab") as out:
            self.userdata = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd="/root",
                start_new_session=True,
            )

    # -- run ----------------------------------------------------------------
    def loop(self) -> None:
        userdata = getattr(self, "userdata", None)
        while not self.stopping:
            reaped = False
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                reaped = True
                code = os.waitstatus_to_exitcode(status)
                if userdata is not None and pid == userdata.pid:
                    userdata.returncode = code
                    self.write_status(userdata_exit=code)
                if self.sshd is not None and pid == self.sshd.pid and not self.stopping:
                    print(f"vminit: sshd exited ({code}); restarting", flush=True)
                    time.sleep(0.5)
                    self.start_sshd()
            if not reaped:
                time.sleep(0.2)
        self.shutdown()

    def shutdown(self) -> None:
        self.write_status(state="stopping")
        os.kill(-1, signal.SIGTERM)  # every process of this pid namespace but us
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    time.sleep(0.05)
            except ChildProcessError:
                break
        else:
            os.kill(-1, signal.SIGKILL)
        self.write_status(state="stopped")


def mount(args: list[str]) -> None:
    subprocess.run(["mount", *args], check=True, stdin=subprocess.DEVNULL)


def mount_type(path: str) -> str | None:
    """Filesystem type of the mount at ``path`` (the top-most one)."""
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            if left.split()[4] == path:
                found = right.split()[0]
    return found


def main(vmdir: Path) -> None:
    init = VmInit(vmdir)

    def stop(signum: int, frame: object) -> None:
        init.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        init.boot()
    except Exception as exc:
        init.write_status(state="failed", error=str(exc))
        print(f"vminit: boot failed: {exc}", file=sys.stderr, flush=True)
        raise
    init.loop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
