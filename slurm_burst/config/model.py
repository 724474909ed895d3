"""The configuration model. Every field is documented; the README's reference is built from it.

Field docstrings live in ``metadata["doc"]`` so ``slurm-burst config schema`` and
the README can print them; defaults here are the only defaults in the code base.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from slurm_burst.core.hostlist import compress
from slurm_burst.core.pricing import PricingError, Rate, RateTable, parse_instant, to_micros


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


def doc(text: str, **kw: Any) -> Any:
    """A dataclass field carrying its documentation."""
    return field(metadata={"doc": text}, **kw)


@dataclass(frozen=True)
class ClusterConfig:
    name: str = doc("Slurm ClusterName; also tags every cloud instance we create.")
    controller_host: str = doc("SlurmctldHost name of the controller.")
    controller_addr: str = doc("Address of slurmctld as on-prem nodes reach it.")


@dataclass(frozen=True)
class SlurmConfig:
    backend: str = doc("How we talk to Slurm: 'cli' (sinfo/squeue/scontrol).", default="cli")
    bin_dir: str = doc("Directory holding sinfo, squeue, scontrol.", default="/usr/bin")
    conf_dir: str = doc("Directory of slurm.conf on the controller.", default="/etc/slurm")
    command_timeout: float = doc("Seconds before a Slurm command is abandoned.", default=30.0)
    update_batch: int = doc("Nodes per 'scontrol update' call (at most 100).", default=100)
    resume_timeout: int = doc("ResumeTimeout: seconds a node has to register.", default=600)
    suspend_timeout: int = doc("SuspendTimeout: seconds to power a node down.", default=120)
    suspend_time: int = doc(
        "SuspendTime: idle seconds before a burst node is released.", default=600
    )
    resume_rate: int = doc("ResumeRate: nodes per minute Slurm resumes (0 = unlimited).", default=0)
    suspend_rate: int = doc(
        "SuspendRate: nodes per minute Slurm suspends (0 = unlimited).", default=0
    )
    hook_dir: str = doc(
        "Directory of the slurm-burst-resume/-suspend/-resume-fail hooks.", default="/usr/local/bin"
    )
    onprem_partitions: tuple[str, ...] = doc(
        "Partitions never powered down (SuspendExcParts).", default=()
    )
    hostlist_max_names: int = doc(
        "Largest hostlist we expand (guards against typos).", default=1_000_000
    )
    power_save_interval: int = doc(
        "SlurmctldParameters power_save_interval: seconds between Slurm's power-save passes "
        "(Slurm's default 10; it dominates job start latency on a small cluster).",
        default=10,
    )
    munge_socket: str = doc(
        "munged socket path on cloud nodes; must match AuthInfo=socket= in slurm.conf.",
        default="/run/munge/munge.socket.2",
    )
    munge_key: str = doc(
        "The cluster's munge key on this host; pushed to cloud nodes over SFTP only.",
        default="/etc/munge/munge.key",
    )
    release: str = doc(
        "Slurm release of the cluster's slurmctld ('22.05', '24.11' or '26.05'): what "
        "'conf render' emits. Empty: read from 'sinfo --version' in bin_dir.",
        default="",
    )
    prolog_chain: str = doc(
        "The site's own PrologSlurmctld, run by ours (Slurm takes one): for every job, "
        "after its cloud nodes have registered; its exit status is the prolog's. "
        "Empty: none.",
        default="",
    )


@dataclass(frozen=True)
class PartitionConfig:
    name: str = doc("Partition name (the table key).")
    suspend_time: int | None = doc(
        "Per-partition SuspendTime; default slurm.suspend_time.", default=None
    )
    max_time: str = doc("MaxTime of the partition.", default="INFINITE")
    default: bool = doc("Make this the default partition.", default=False)


@dataclass(frozen=True)
class Credentials:
    file: str = doc("Path of a TOML file with 'key' and 'secret' (mode 0600).", default="")
    key_env: str = doc("Environment variable holding the access key.", default="")
    secret_env: str = doc("Environment variable holding the secret.", default="")


@dataclass(frozen=True)
class ProviderConfig:
    name: str = doc("Profile name (the table key).")
    driver: str = doc("libcloud compute driver: ec2, gce, azure_arm, openstack, nscloud, ...")
    region: str = doc("Provider region or zone.", default="")
    credentials: Credentials | None = doc("Where the credentials are (never inline).", default=None)
    options: Mapping[str, Any] = doc(
        "Keyword arguments of the driver's constructor (GCE project, Azure tenant_id and "
        "subscription_id, OpenStack ex_force_auth_url, an endpoint's host/port/secure).",
        default_factory=_empty,
    )
    zone: str = doc(
        "Availability zone (EC2, OpenStack), zone (GCE) or location (Azure) to launch in.",
        default="",
    )
    network: str = doc(
        "GCE network name; Azure virtual network name; OpenStack network UUIDs "
        "(comma-separated). EC2 uses subnet only.",
        default="",
    )
    subnet: str = doc("EC2 subnet id; GCE subnetwork; Azure subnet name.", default="")
    security_groups: tuple[str, ...] = doc(
        "EC2 security group ids; OpenStack security group names; GCE network tags "
        "(firewall rules select on them). Azure: the subnet's NSG applies.",
        default=(),
    )
    key_name: str = doc(
        "EC2/OpenStack key pair to launch with; empty: the daemon's public key is imported "
        "once as a key pair of its own.",
        default="",
    )
    resource_group: str = doc("Azure resource group (required for azure_arm).", default="")
    root_device: str = doc(
        "EC2 root device name of the image, for node_groups.*.disk_gb (Ubuntu: /dev/sda1, "
        "Amazon Linux: /dev/xvda).",
        default="/dev/sda1",
    )
    launch_batch: int = doc(
        "Nodes per launch call. 0: the driver's default (ec2: 500 per RunInstances, "
        "MinCount = MaxCount; others: 1).",
        default=0,
    )
    launch_options: Mapping[str, Any] = doc(
        "Extra create_node keyword arguments, passed as they are (e.g. ex_iamprofile).",
        default_factory=_empty,
    )
    host_keys: str = doc(
        "Where the daemon reads a new instance's SSH host keys through the API: 'console' "
        "(ec2, openstack), 'guest-attributes' or 'serial-port' (gce), 'boot-diagnostics' "
        "(azure_arm). Empty: the driver's first.",
        default="",
    )
    host_key_reads_per_second: float = doc(
        "Most host-key reads per second for all joining nodes together (the provider's API "
        "limit). 0: the driver's default (ec2 10, gce 10, azure_arm 2, openstack 5).",
        default=0.0,
    )


_PATTERN = re.compile(
    r"^(?P<pre>[A-Za-z0-9][A-Za-z0-9._-]*?)\{n(?::0(?P<w>\d)d)?\}(?P<post>[A-Za-z0-9._-]*)$"
)


@dataclass(frozen=True)
class NodeGroup:
    name: str = doc("Group name (the table key).")
    pattern: str = doc("Node name pattern: '{n}' is the index, '{n:03d}' zero-pads it.")
    count: int = doc("How many nodes the group defines (indices 1..count).")
    partition: str = doc("Burst partition the nodes belong to.")
    providers: tuple[str, ...] = doc("Provider profiles, in fallback order.")
    sizes: tuple[str, ...] = doc(
        "Instance sizes, in fallback order; 'PROVIDER:SIZE' offers a size on one provider "
        "only (e.g. ['onprem:g1.gpu', 'aws:g5.xlarge']), a bare size on every provider."
    )
    image: str = doc("Image (AMI, image name or URN) to boot.")
    cpus: int = doc("CPUs Slurm schedules on each node.")
    memory_mb: int = doc("RealMemory (MB) Slurm schedules on each node.")
    gpus: int = doc("GPUs per node.", default=0)
    gpu_type: str = doc("GPU type for Gres (e.g. a100).", default="")
    gpu_files: str = doc("gres.conf File= for the GPUs; default /dev/nvidia[0-N].", default="")
    price_per_hour: Mapping[str, float] = doc(
        "Price per instance-hour, by size.", default_factory=_empty
    )
    max_nodes: int | None = doc("Most nodes running at once; default count.", default=None)
    features: tuple[str, ...] = doc("Slurm node features.", default=())
    spot: bool = doc("Ask for spot/preemptible capacity.", default=False)
    spot_max_price: float = doc(
        "EC2: the most to pay per spot instance-hour; 0: up to the on-demand price.",
        default=0.0,
    )
    accelerator: str = doc(
        "The provider's accelerator type for the GPUs (GCE: nvidia-tesla-t4); default gpu_type.",
        default="",
    )
    disk_gb: int = doc("Root disk size in GB; 0: the image's.", default=0)
    all_or_nothing: str = doc(
        "'job': a multi-node job gets all its nodes or none (a node that cannot be "
        "launched or bootstrapped fails its job, which Slurm requeues, and the job's "
        "other nodes are released at once); 'node': best effort, each node on its own.",
        default="job",
    )
    tags: Mapping[str, str] = doc(
        "Extra tags (GCE: labels) on every instance, e.g. a cost center.",
        default_factory=_empty,
    )

    @cached_property
    def _name_parts(self) -> tuple[str, int, str]:
        """(prefix, index width, suffix) of ``pattern``, parsed once."""
        m = _PATTERN.match(self.pattern)
        if m is None:
            raise ValueError(f"invalid node name pattern {self.pattern!r}")
        return m.group("pre"), int(m.group("w") or 0), m.group("post")

    def node_name(self, index: int) -> str:
        pre, width, post = self._name_parts
        return f"{pre}{index:0{width}d}{post}"

    def node_names(self) -> list[str]:
        pre, width, post = self._name_parts
        return [f"{pre}{i:0{width}d}{post}" for i in range(1, self.count + 1)]

    def candidates(self) -> list[tuple[str, str]]:
        """(provider, size) in fallback order: each provider's sizes, then the next's."""
        out = []
        for p in self.providers:
            for entry in self.sizes:
                owner, sep, size = entry.rpartition(":")
                if not sep or owner == p:
                    out.append((p, size))
        return out

    @property
    def size_names(self) -> list[str]:
        """The sizes without their provider qualifier, in order, each once."""
        return list(dict.fromkeys(s.rpartition(":")[2] for s in self.sizes))

    @property
    def hostlist(self) -> str:
        return compress(self.node_names())

    @property
    def limit(self) -> int:
        return self.count if self.max_nodes is None else self.max_nodes


@dataclass(frozen=True)
class MeshConfig:
    subnet: str = doc(
        "WireGuard mesh subnet; the hub takes its first address.", default="10.77.0.0/16"
    )
    interface: str = doc("Hub WireGuard interface name.", default="wg-burst")
    endpoint: str = doc("Public address cloud nodes dial to reach the hub.", default="")
    port: int = doc("Hub UDP port.", default=51820)
    keepalive: int = doc("PersistentKeepalive seconds from nodes to the hub (NAT).", default=15)
    state_dir: str = doc(
        "Hub key and persistent WireGuard config (mode 0700).", default="/etc/slurm-burst/wireguard"
    )


@dataclass(frozen=True)
class LedgerConfig:
    url: str = doc(
        "SQLAlchemy database URL: sqlite:////path.db (default), "
        "postgresql+psycopg://user@host/db or mysql+pymysql://user@host/db.",
        default="sqlite:////var/lib/slurm-burst/ledger.db",
    )
    spool_dir: str = doc(
        "Where ledger writes wait while the database is unreachable (mode 0700); "
        "default <daemon.state_dir>/ledger-spool.",
        default="",
    )
    accounting: bool = doc(
        "Read job usage from Slurm accounting (sacct; needs slurmdbd).", default=True
    )
    ingest_interval: float = doc("Seconds between sacct ingest passes.", default=60.0)
    ingest_overlap: float = doc(
        "Seconds of the previous sacct window read again (clock skew, late records).",
        default=300.0,
    )
    overhead: str = doc(
        "Who pays what no job used (boot, idle, failed launches): 'usage' spreads an "
        "instance's overhead over the accounts that used it, by usage share; 'site' "
        "books all of it to site_account.",
        default="usage",
    )
    site_account: str = doc(
        "Account that pays overhead nobody used, and rate-override differences.",
        default="burst-overhead",
    )
    budget_sync_interval: float = doc(
        "Seconds between budget syncs into Slurm's GrpTRESMins=billing limits.", default=60.0
    )
    billing_weights: bool = doc(
        "Render TRESBillingWeights (micro-dollars per minute) on burst partitions, so "
        "Slurm can enforce budgets with GrpTRESMins=billing.",
        default=True,
    )


@dataclass(frozen=True)
class RateConfig:
    name: str = doc("Rate name (the table key); recorded with every price it sets.")
    size: str = doc("Instance size this rate prices.")
    price_per_hour: float = doc("Price in dollars per hour (per instance, or per GPU).")
    per: str = doc(
        "'instance' (price per instance-hour) or 'gpu' (per GPU-hour).", default="instance"
    )
    valid_from: str = doc(
        "First day (UTC, YYYY-MM-DD or ISO 8601 time) it applies.", default="1970-01-01"
    )
    valid_to: str = doc("First day it no longer applies; empty: open-ended.", default="")
    account: str = doc(
        "Slurm account this rate is for (a chargeback override); empty: the provider price.",
        default="",
    )


@dataclass(frozen=True)
class DaemonConfig:
    socket: str = doc(
        "Local socket the hooks use to wake the daemon.", default="/run/slurm-burst/daemon.sock"
    )
    state_dir: str = doc(
        "Directory of the daemon's state database and keys.", default="/var/lib/slurm-burst"
    )
    group: str = doc(
        "Group of Slurm's SlurmUser. The hooks run as SlurmUser and write the state "
        "database, wake the daemon and log through it: state_dir is 0770, the state "
        "database (with its -wal and -shm), the socket and the hook log 0660, all in "
        "this group; everything else is the daemon's alone.",
        default="slurm",
    )
    poll_period: float = doc("Seconds between reconcile passes.", default=30.0)
    heartbeat_stale: float = doc(
        "Seconds after which the daemon's heartbeat counts as stale.", default=120.0
    )
    hook_log: str = doc(
        "Log file of the resume/suspend hooks (Slurm discards their output).",
        default="/var/log/slurm-burst/hooks.log",
    )
    log_file: str = doc("Log file of the daemon; empty: standard error (journald).", default="")
    workers: int = doc("Nodes provisioned or torn down at the same time.", default=64)
    ssh_user: str = doc(
        "User the daemon logs in as on cloud nodes (needs root rights).", default="root"
    )
    boot_timeout: float = doc(
        "Seconds for an instance to run and report its SSH host key.", default=300.0
    )
    bootstrap_timeout: float = doc(
        "Seconds for SSH to answer and the node to join after it runs.", default=300.0
    )
    register_timeout: float = doc(
        "Seconds slurmd has to register with slurmctld after it is started on a node; "
        "then the node fails with SlurmdNotRegistered (before Slurm's ResumeTimeout).",
        default=180.0,
    )
    orphan_grace: float = doc(
        "Seconds a cloud instance no live node owns is left alone before it is terminated.",
        default=120.0,
    )
    capacity_cooldown: float = doc(
        "Seconds a size is skipped after a capacity error (the group falls back to the next).",
        default=600.0,
    )
    protect_after: int = doc(
        "Failed launches in a row after which a node group goes into protected mode.",
        default=10,
    )
    protect_cooldown: float = doc(
        "Seconds a protected node group stays unavailable (or: slurm-burst group enable).",
        default=1800.0,
    )
    api_attempts: int = doc(
        "Attempts of a throttled cloud call (exponential backoff with jitter).", default=5
    )
    api_backoff: float = doc("First backoff of a throttled cloud call, seconds.", default=1.0)
    api_backoff_max: float = doc(
        "Longest backoff of a throttled cloud call, seconds.", default=30.0
    )
    metrics_listen: str = doc(
        "Prometheus endpoint, HOST:PORT; empty: no endpoint.", default="127.0.0.1:9466"
    )
    ha_url: str = doc(
        "PostgreSQL URL for active/passive HA (an advisory lock elects the leader); "
        "empty: one daemon, no election.",
        default="",
    )
    node_id: str = doc(
        "This daemon's name in status and in the HA election; empty: the host name.",
        default="",
    )


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


@dataclass(frozen=True)
class Config:
    cluster: ClusterConfig = doc("The Slurm cluster.")
    slurm: SlurmConfig = doc("Talking to Slurm.", default=SlurmConfig())
    partitions: Mapping[str, PartitionConfig] = doc(
        "Burst partition settings.", default_factory=_empty
    )
    node_groups: Mapping[str, NodeGroup] = doc("Cloud node groups.", default_factory=_empty)
    providers: Mapping[str, ProviderConfig] = doc(
        "Cloud provider profiles.", default_factory=_empty
    )
    mesh: MeshConfig = doc("WireGuard mesh.", default=MeshConfig())
    ledger: LedgerConfig = doc("Cost ledger.", default=LedgerConfig())
    rates: Mapping[str, RateConfig] = doc(
        "Prices with validity periods (and per-account overrides); they add to and win "
        "over node_groups.*.price_per_hour.",
        default_factory=_empty,
    )
    daemon: DaemonConfig = doc("The daemon.", default=DaemonConfig())
    lab: LabConfig | None = doc("The local lab (only for 'slurm-burst lab').", default=None)
    source: str = field(default="<string>", metadata={"internal": True})

    def burst_partitions(self) -> list[str]:
        return list(dict.fromkeys(g.partition for g in self.node_groups.values()))

    @cached_property
    def _group_index(self) -> Mapping[str, NodeGroup]:
        return {name: g for g in self.node_groups.values() for name in g.node_names()}

    def rate_list(self) -> list[Rate]:
        """Every price as a core Rate: node groups' price_per_hour, then [rates.*].

        A group's ``price_per_hour`` is a rate valid since 1970; a [rates] entry for
        the same size starts later and so wins from its ``valid_from`` on. Entries
        whose dates or prices do not parse are left out (validation reports them).
        """
        out = []
        for g in self.node_groups.values():
            for size, price in g.price_per_hour.items():
                with contextlib.suppress(PricingError):
                    out.append(
                        Rate(f"node_groups.{g.name}.price_per_hour.{size}", size, to_micros(price))
                    )
        for r in self.rates.values():
            try:
                start = parse_instant(r.valid_from, f"rates.{r.name}.valid_from")
                end = parse_instant(r.valid_to, f"rates.{r.name}.valid_to") if r.valid_to else None
                micros = to_micros(r.price_per_hour)
            except PricingError:
                continue
            out.append(Rate(f"rates.{r.name}", r.size, micros, r.per, start, end, r.account))
        return out

    @cached_property
    def rate_table(self) -> RateTable:
        return RateTable(self.rate_list())

    def gpus_of_size(self, size: str) -> int:
        """GPUs of the node group(s) using ``size`` (0 for a CPU size)."""
        return max((g.gpus for g in self.node_groups.values() if size in g.size_names), default=0)

    def group_of(self, node: str) -> NodeGroup | None:
        """The node group defining ``node``, or None for a node we do not manage."""
        return self._group_index.get(node)
