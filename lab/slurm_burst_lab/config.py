"""The lab's own config section, ``[lab]``: a plugin section (slurm_burst.extensions), built
and checked by the product's loader like its own sections, and read with :func:`settings`."""

from __future__ import annotations

import contextlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from slurm_burst.config import Config
from slurm_burst.config.load import dropin_dir
from slurm_burst.config.model import doc
from slurm_burst.config.schema import Problem
from slurm_burst.core.slurmsyntax import is_name, is_path
from slurm_burst.fileio import write_durable

NAME = "lab"
_DB_NAME = re.compile(r"[A-Za-z0-9_]{1,64}", re.ASCII)


@dataclass(frozen=True)
class LabConfig:
    state_dir: str = doc(
        "Where the lab keeps its state, logs and VM disks.", default="/var/lib/slurm-burst-lab"
    )
    lan_subnet: str = doc(
        "On-prem network: the controller takes its first address, static nodes the next ones.",
        default="10.250.0.0/24",
    )
    cloud_provider: str = doc(
        "Provider profile (driver 'nscloud') whose bridge is the lab's 'internet'.", default="lab"
    )
    onprem_partition: str = doc("Partition of the static on-prem nodes.", default="onprem")
    onprem_nodes: int = doc("Static on-prem nodes.", default=1)
    onprem_cpus: int = doc("CPUs of each on-prem node.", default=2)
    onprem_memory_mb: int = doc("RealMemory of each on-prem node.", default=1000)
    accounts: tuple[str, ...] = doc(
        "Slurm accounts the lab creates in slurmdbd; root's default is the first.",
        default=("physics", "chemistry"),
    )
    accounting_db: str = doc(
        "MariaDB database of the lab's slurmdbd (dropped by 'lab down').",
        default="slurm_burst_lab_acct",
    )
    dbd_port: int = doc("Port of the lab's slurmdbd.", default=6819)
    shared_dir: str = doc(
        "The lab's shared filesystem (like a site's NFS): seen by every node, for job output.",
        default="/srv/slurm-burst-lab",
    )
    daemon: bool = doc("Start the slurm-burst daemon with the lab.", default=True)
    ec2_provider: str = doc(
        "Provider profile (driver 'ec2', options host 127.0.0.1 and a port) the lab serves "
        "with its EC2 emulator, whose instances boot as VMs on the cloud bridge; '' none.",
        default="",
    )
    gce_provider: str = doc(
        "Provider profile (driver 'gce', options.endpoint http://127.0.0.1:PORT) the lab "
        "serves with its Compute Engine emulator, whose instances boot as VMs on the cloud "
        "bridge in a subnet of their own (gce_subnet); '' none.",
        default="",
    )
    gce_subnet: str = doc(
        "The GCE instances' subnet on the cloud bridge (its first address the bridge's).",
        default="10.251.1.0/24",
    )
    azure_provider: str = doc(
        "Provider profile (driver 'azure_arm', options.endpoint https://127.0.0.1:PORT and "
        "options.ca_file the lab CA's certificate under state_dir/azure) the lab serves with "
        "its Azure emulator over TLS, whose VMs boot on the cloud bridge in a subnet of their "
        "own (azure_subnet); '' none.",
        default="",
    )
    azure_subnet: str = doc(
        "The Azure VMs' subnet on the cloud bridge (its first address the bridge's).",
        default="10.251.2.0/24",
    )
    prometheus: str = doc(
        "HOST:PORT of the lab's Prometheus (Debian's package), which scrapes the daemon "
        "every second and evaluates the shipped alert rules with 2-s 'for' windows; '' none.",
        default="",
    )
    pre_run_poll: int = doc(
        "Seconds between burst_buffer/lua's checks that a staging job's nodes have booted. "
        "Slurm sleeps 60 s between them, hard-coded; below 60, the lab's slurmctld runs "
        "with a preloaded sleep() that makes that one sleep this long "
        "(lab/slurm_burst_lab/prerunpoll). 60 runs Slurm's own.",
        default=60,
    )
    fault_file: str = doc(
        "The fault matrix's rules (lab/slurm_burst_lab/faults.py), applied to the calls the "
        "daemon makes to the lab cloud (cloud_provider); '' none.",
        default="",
    )
    runtime_reference: str = doc(
        "Where 'lab up' writes the runtime manifest it captures on the first on-prem node "
        "once it is up (what a site does with 'slurm-burst runtime capture'): the "
        "reference a node group names as its runtime_manifest; '' none.",
        default="",
    )
    runtime_packages: tuple[str, ...] = doc(
        "Python distributions the reference records (the training job's).", default=()
    )
    runtime_libraries: tuple[str, ...] = doc(
        "Shared libraries (sonames) the reference records, with their digests.", default=()
    )


def write_dropin(config: Path, name: str, body: str) -> Path:
    """A drop-in ``name`` of the lab's config ``config`` (durable; its directory made)."""
    where = dropin_dir(config)
    where.mkdir(mode=0o755, exist_ok=True)
    return write_durable(where, name, body.encode(), 0o644)


def remove_dropin(config: Path, name: str) -> bool:
    """The drop-in ``name`` of ``config`` removed (True), if there was one; its directory
    too when nothing else is in it."""
    where = dropin_dir(config)
    try:
        (where / name).unlink()
    except FileNotFoundError:
        return False
    with contextlib.suppress(OSError):
        where.rmdir()
    return True


def settings(cfg: Config) -> LabConfig:
    """The config's [lab] section; LookupError if it has none (not a lab config)."""
    lab = cfg.section(NAME)
    if not isinstance(lab, LabConfig):
        raise LookupError(f"{cfg.source} has no [lab] section: it is not a lab config")
    return lab


def validate(lab: LabConfig, cfg: Config) -> list[Problem]:
    out: list[Problem] = []
    try:
        ipaddress.ip_network(lab.lan_subnet)
    except ValueError as exc:
        out.append(Problem("lab.lan_subnet", f"is not a network: {exc}"))
    if lab.onprem_nodes < 1:
        out.append(Problem("lab.onprem_nodes", "the lab needs at least one on-prem node"))
    cloud = cfg.providers.get(lab.cloud_provider)
    if cloud is None or cloud.driver != "nscloud":
        out.append(
            Problem("lab.cloud_provider", "must name a provider profile whose driver is 'nscloud'")
        )
    if not _DB_NAME.fullmatch(lab.accounting_db):
        out.append(Problem("lab.accounting_db", "must be letters, digits or '_'"))
    for acct in lab.accounts:
        if not is_name(acct):
            out.append(Problem("lab.accounts", f"{acct!r} is not a Slurm account name"))
    if lab.onprem_partition not in cfg.slurm.onprem_partitions:
        out.append(Problem("lab.onprem_partition", "must be listed in slurm.onprem_partitions"))
    if not 1 <= lab.pre_run_poll <= 60:
        out.append(Problem("lab.pre_run_poll", "must be 1 to 60 seconds (60: Slurm's own)"))
    if lab.fault_file and not is_path(lab.fault_file):
        out.append(Problem("lab.fault_file", "must be an absolute path"))
    if lab.runtime_reference and not is_path(lab.runtime_reference):
        out.append(Problem("lab.runtime_reference", "must be an absolute path"))
    if lab.ec2_provider:
        ec2 = cfg.providers.get(lab.ec2_provider)
        ec2_port = (ec2.options.get("port") if ec2 is not None else None) or 0
        if ec2 is None or ec2.driver != "ec2" or ec2.options.get("host") != "127.0.0.1":
            out.append(
                Problem(
                    "lab.ec2_provider",
                    "must name a provider profile with driver 'ec2' and options.host "
                    "'127.0.0.1' (the lab's EC2 emulator)",
                )
            )
        elif not isinstance(ec2_port, int) or not 1024 <= ec2_port <= 65535:
            out.append(Problem("lab.ec2_provider", "its options.port must be 1024..65535"))
    if lab.gce_provider:
        out += _gce_problems(lab, cfg)
    if lab.azure_provider:
        out += _azure_problems(lab, cfg)
    return out


def azure_port(endpoint: object) -> int | None:
    """The port of a ``https://127.0.0.1:PORT`` endpoint (the lab's emulator), else None."""
    return _loopback_port(endpoint, "https")


def _azure_problems(lab: LabConfig, cfg: Config) -> list[Problem]:
    az = cfg.providers.get(lab.azure_provider)
    ca = f"{lab.state_dir.rstrip('/')}/azure/ca.pem"
    if az is None or az.driver != "azure_arm" or azure_port(az.options.get("endpoint")) is None:
        return [Problem("lab.azure_provider", "must name a provider profile with driver "
                        "'azure_arm' and options.endpoint 'https://127.0.0.1:PORT' (the lab's "
                        "Azure emulator; PORT 1024..65535)")]  # fmt: skip
    if az.options.get("ca_file") != ca:
        return [Problem("lab.azure_provider", f"its options.ca_file must be {ca} (the lab's CA)")]
    return _subnet_problems("lab.azure_subnet", lab.azure_subnet, lab, cfg, lab.gce_subnet)


def _subnet_problems(key: str, subnet: str, lab: LabConfig, cfg: Config, *others: str
                     ) -> list[Problem]:  # fmt: skip
    try:
        net = ipaddress.IPv4Network(subnet)
        cloud = ipaddress.ip_network(str(cfg.providers[lab.cloud_provider].options.get(
            "subnet", "10.251.0.0/24")))  # fmt: skip
        taken = [ipaddress.ip_network(o) for o in others if o]
    except (ValueError, KeyError) as exc:
        return [Problem(key, f"is not an IPv4 network: {exc}")]
    if net.overlaps(cloud) or any(net.overlaps(t) for t in taken) or net.num_addresses < 8:
        return [Problem(key, f"must be a network of 8 addresses or more apart from the "
                        f"namespace cloud's {cloud} and the other emulators'")]  # fmt: skip
    return []


def gce_port(endpoint: object) -> int | None:
    """The port of a ``http://127.0.0.1:PORT`` endpoint (the lab's emulator), else None."""
    return _loopback_port(endpoint, "http")


def _loopback_port(endpoint: object, scheme: str) -> int | None:
    m = re.fullmatch(rf"{scheme}://127\.0\.0\.1:(\d{{4,5}})/?", str(endpoint or ""))
    port = int(m.group(1)) if m else 0
    return port if 1024 <= port <= 65535 else None


def _gce_problems(lab: LabConfig, cfg: Config) -> list[Problem]:
    gce = cfg.providers.get(lab.gce_provider)
    if gce is None or gce.driver != "gce" or gce_port(gce.options.get("endpoint")) is None:
        return [Problem("lab.gce_provider", "must name a provider profile with driver 'gce' "
                        "and options.endpoint 'http://127.0.0.1:PORT' (the lab's Compute "
                        "Engine emulator; PORT 1024..65535)")]  # fmt: skip
    return _subnet_problems("lab.gce_subnet", lab.gce_subnet, lab, cfg)
