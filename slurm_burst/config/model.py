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

from slurm_burst.core.hostlist import compress, expand
from slurm_burst.core.policy import Rule
from slurm_burst.core.pricing import PricingError, Rate, RateTable, parse_instant, to_micros
from slurm_burst.core.warm import Window, window


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
    metrics: str = doc(
        "slurmctld's own OpenMetrics (Slurm 25.11 and newer: MetricsType=metrics/"
        "openmetrics, served on SlurmctldPort at /metrics/jobs, /metrics/nodes, "
        "/metrics/partitions, /metrics/scheduler, /metrics/jobs-users-accts): 'off'; "
        "'open', served without authentication to whoever reaches slurmctld's port, "
        "every cloud node over the mesh included (MetricsParameters=ignore_private_data: "
        "the fragment's PrivateData=cloud would restrict them), job counts by user and "
        "account among them; 'users' (26.05+), to root, SlurmUser and metrics_users only "
        "(MetricsAuthUsers), each scrape authenticated with a JWT from the site's "
        "auth/jwt set-up (docs/observability.md, 'slurmctld's own metrics').",
        default="off",
    )
    metrics_users: tuple[str, ...] = doc(
        "With metrics = 'users': the users allowed to scrape (MetricsAuthUsers), e.g. "
        "['prometheus'].",
        default=(),
    )
    max_node_count: int = doc(
        "MaxNodeCount for slurm.conf: every node slurmctld may hold, the site's own and "
        "ours, declared and dynamic. Needed with a dynamic node group (Slurm makes room "
        "for nodes created at run time only up to it); at least the burst nodes "
        "declared plus the dynamic groups' max_nodes. 0: not written.",
        default=0,
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
    driver: str = doc(
        "libcloud compute driver: ec2, gce, azure_arm, openstack, or one a plugin adds"
    )
    region: str = doc("Provider region or zone.", default="")
    credentials: Credentials | None = doc("Where the credentials are (never inline).", default=None)
    options: Mapping[str, Any] = doc(
        "Keyword arguments of the driver's constructor (GCE project, Azure tenant_id and "
        "subscription_id, OpenStack ex_force_auth_url, an endpoint's host/port/secure), "
        "and the provider's own: gce and azure_arm endpoint (https://HOST[:PORT]); "
        "azure_arm ca_file, admin_user, boot_diagnostics_storage and "
        "boot_diagnostics_sas_env (docs/providers.md).",
        default_factory=_empty,
    )
    zone: str = doc(
        "Availability zone (EC2, OpenStack), zone (GCE) or location (Azure) to launch in. "
        "GCE without one: launches go to the region (regionInstances.bulkInsert; Compute "
        "picks the zone, one zone for a whole job).",
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
        "limit). 0: the driver's default (ec2: its GetConsoleOutput budget; gce 10, "
        "azure_arm 2, openstack 5).",
        default=0.0,
    )
    api_limits: Mapping[str, Any] = doc(
        "The account's request buckets per API, where they differ from the provider's "
        "documented ones (ec2: docs/scale.md), as API = [burst, refill per second], e.g. "
        "{ DescribeInstances = [200, 40] } after a limit increase; for gce a quota group "
        "(default, read_requests, list_requests, operation_read_requests) as [1, calls a "
        "minute / 60], its calls a minute all the daemon's; for azure_arm reads, writes "
        "or deletes as [burst, refill per second]. Profiles on the same account and "
        "region (gce: the same project; azure_arm: the same principal) share them.",
        default_factory=_empty,
    )


# Matched whole (fullmatch) and ASCII-only: a node name is a hostname in slurm.conf.
_PATTERN = re.compile(
    r"(?P<pre>[A-Za-z0-9][A-Za-z0-9._-]*?)\{n(?::0(?P<w>[1-9])d)?\}(?P<post>[A-Za-z0-9._-]*)",
    re.ASCII,
)


@dataclass(frozen=True)
class WarmConfig:
    name: str = doc("The window's name (the table key).")
    nodes: int = doc("Nodes kept joined in the window.")
    start: str = doc("HH:MM, the controller's local time.")
    end: str = doc("HH:MM; at or before start: the next day's.")
    days: str = doc("Days of the week: 'mon-fri', 'sat,sun', 'daily'.", default="mon-fri")

    def window(self) -> Window:
        """The window (ValueError when a field is not understood: config check says)."""
        return window(self.nodes, self.days, self.start, self.end)


# The NodeSet and feature of a dynamic group: sbdyn_<group> (a node carrying one is ours)
DYNAMIC_PREFIX = "sbdyn_"


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
    gpu_model: str = doc(
        "The GPU model as NVML names it (e.g. 'NVIDIA A100-SXM4-80GB'); the node's GPU "
        "check refuses others. '': any model.",
        default="",
    )
    gpu_driver: str = doc(
        "The NVIDIA driver version the group pins (e.g. '550.54.15'), as on-prem; the "
        "GPU check refuses others. '': any.",
        default="",
    )
    gpu_cuda: str = doc(
        "The CUDA runtime the group's jobs use (e.g. '12.4'): the node's driver must "
        "support at least it (NVML's CUDA version is the highest the driver supports). "
        "'': not checked.",
        default="",
    )
    gpu_check: bool = doc(
        "Run the GPU check (NVML) on each node before slurmd starts: a node that fails it "
        "never joins (GpuUnhealthy). Only for groups with GPUs.",
        default=True,
    )
    runtime_manifest: str = doc(
        "The group's reference runtime manifest, an absolute path ('slurm-burst runtime "
        "capture' on an on-prem node, docs/runtime.md): before slurmd starts, each node "
        "captures the same fields and the daemon refuses one that differs beyond "
        "runtime_rule (RuntimeMismatch). Read at each join. '': not checked.",
        default="",
    )
    images: tuple[str, ...] = doc(
        "Container images ([images] keys) each node holds before slurmd starts: pulled "
        "from the staging store, every blob verified against its digest, loaded into "
        "podman (ImageDigest if anything differs). Needs staging.store.",
        default=(),
    )
    runtime_rule: str = doc(
        "How a node may differ from runtime_manifest: 'exact' (every captured field "
        "equal) or 'compatible' (only where the component's own promise covers it: a "
        "newer driver or glibc, the same NCCL and MPI series...; docs/runtime.md lists "
        "each rule and its source).",
        default="compatible",
    )
    price_per_hour: Mapping[str, float] = doc(
        "Price per instance-hour, by size.", default_factory=_empty
    )
    warm: Mapping[str, WarmConfig] = doc(
        "Warm capacity: windows of the week in which this many of the group's nodes are "
        "kept joined, idle or not (e.g. [node_groups.gpu.warm.weekdays] nodes = 2, "
        "days = 'mon-fri', start = '08:00', end = '20:00'). The group's last nodes are "
        "its warm pool (SuspendExcNodes); their idle cost in a window is the site's.",
        default_factory=_empty,
    )
    max_nodes: int | None = doc(
        "Most instances at once that are not terminating (requested, booting, joined, "
        "idle); default count. Below count, the daemon keeps the powered-down nodes past "
        "the room drained in Slurm (Code:GroupAtCap), so further jobs wait in the queue, "
        "and refuses any resume that still gets past it (docs/configuration.md, 'Node cap').",
        default=None,
    )
    features: tuple[str, ...] = doc("Slurm node features.", default=())
    nodes: str = doc(
        "How Slurm knows the group's nodes: 'declared', NodeName lines in slurm.conf "
        "(conf render writes them); 'dynamic' (Slurm 23.11 and newer), none in "
        "slurm.conf: the daemon creates the group's first max_nodes nodes in slurmctld "
        "('scontrol create ... State=CLOUD', with the group's CPUs, memory, GPUs and "
        "features), the partition takes them through a NodeSet of the feature "
        "'sbdyn_<group>', and nodes past max_nodes are deleted once they hold no job, "
        "no reservation and no instance. Needs slurm.max_node_count "
        "(docs/configuration.md, 'Dynamic node groups').",
        default="declared",
    )
    spot: bool = doc("Ask for spot/preemptible capacity.", default=False)
    spot_max_price: float = doc(
        "EC2 and Azure: the most to pay per spot instance-hour; 0: up to the on-demand price.",
        default=0.0,
    )
    spot_fallback: str = doc(
        "A spot group's on-demand fallback: another node group (not spot; the same "
        "cpus, memory_mb, gpus and gpu_type, which Slurm knows the nodes by) whose "
        "providers, sizes, image and prices this group's nodes launch on when spot "
        "capacity is refused (at once) or has not arrived within spot_fallback_after. "
        "'': none (a refusal falls back to the group's next size, as on-demand does).",
        default="",
    )
    spot_fallback_after: float = doc(
        "Seconds a spot launch may wait for its capacity to arrive (instances still "
        "pending) before its nodes fall back to spot_fallback, a job's nodes together. "
        "With boot_timeout it must fit in Slurm's ResumeTimeout (config check).",
        default=120.0,
    )
    cloud_to_cloud: str = doc(
        "How the group's nodes reach other cloud nodes of the same provider profile "
        "(provider and region): 'hub', through the on-prem hub like everything else; "
        "'wireguard', WireGuard tunnels between the nodes themselves (their private "
        "addresses, mesh.node_port), so an all-reduce between two of them never crosses "
        "the site's link. Traffic to on-prem goes through the hub either way, and "
        "Slurm's NodeAddr (the mesh address) works for both.",
        default="hub",
    )
    placement: str = doc(
        "Placement per job, as the provider offers it: 'cluster' (EC2: a cluster "
        "placement group, one network spine), 'compact' (GCE: a compact placement "
        "policy, one zone), 'infiniband' (Azure: a Uniform scale set per job with one "
        "placement group, its InfiniBand fabric; for the RDMA sizes) or 'proximity' "
        "(Azure: a proximity placement group per job, one datacenter, with a scale set of "
        "its own): the instances of "
        "each multi-node job launch together into a "
        "placement made for that launch, deleted once none of its instances remain, "
        "i.e. when the last of the job's nodes is released (suspend_time after its "
        "last job); a job that does not fit falls back whole to the next size or "
        "provider, never split. '': the provider places each instance.",
        default="",
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
        m = _PATTERN.fullmatch(self.pattern)
        if m is None:
            raise ValueError(f"invalid node name pattern {self.pattern!r}")
        return m.group("pre"), int(m.group("w") or 0), m.group("post")

    @property
    def gres_files(self) -> str:
        """gres.conf's File= for the group's GPUs: ``gpu_files``, else /dev/nvidia[0-N]."""
        return self.gpu_files or (
            f"/dev/nvidia[0-{self.gpus - 1}]" if self.gpus > 1 else "/dev/nvidia0"
        )

    def gpu_device_files(self) -> list[str]:
        """The gres.conf File= of the group's GPUs, one path per GPU."""
        if not self.gpus:
            return []
        head, _, tail = self.gres_files.rpartition("/")  # hostlist brackets in the name
        return [f"{head}/{name}" for name in expand(tail)]

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

    @property
    def dynamic(self) -> bool:
        """Created in slurmctld at run time (``nodes = "dynamic"``), not in slurm.conf."""
        return self.nodes == "dynamic"

    def slurm_names(self) -> list[str]:
        """The nodes slurmctld holds once settled: a declared group's every node, a
        dynamic group's first max_nodes (the daemon makes them)."""
        return self.node_names()[: self.limit] if self.dynamic else self.node_names()

    @property
    def nodeset(self) -> str:
        """A dynamic group's NodeSet name and the feature its nodes carry (one word)."""
        return f"{DYNAMIC_PREFIX}{self.name}"

    def warm_pool(self) -> list[str]:
        """The nodes a warm window may keep up: the group's last ones, as many as its
        largest window (in SuspendExcNodes: Slurm never powers them down itself). Slurm
        gives a job nodes that are up before it powers others up, so which ones does
        not matter to users; the last ones stay clear of hand-picked low numbers."""
        size = min(max((w.nodes for w in self.warm_windows()), default=0), self.count)
        return self.node_names()[self.count - size :] if size else []

    def warm_windows(self) -> tuple[Window, ...]:
        """The warm windows that parse (config check names the others)."""
        out = []
        for w in self.warm.values():
            try:
                out.append(w.window())
            except ValueError:
                continue
        return tuple(out)


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
        "Hub key and persistent WireGuard config (mode 0700).",
        default="/var/lib/slurm-burst/wireguard",
    )
    node_port: int = doc(
        "UDP port on which the nodes of a group with cloud_to_cloud = 'wireguard' take "
        "each other's tunnels (their security group must let it in from each other).",
        default=51820,
    )
    api_port: int = doc(
        "TCP port of the daemon's node API on the hub's mesh address (only over the "
        "tunnel): the nodes' agents read their direct peers from it.",
        default=51821,
    )
    sync_interval: float = doc(
        "Seconds between a node agent's reads of its direct peers (a new node's traffic "
        "goes through the hub until its peers have read it).",
        default=5.0,
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
    user: str = doc(
        "Slurm's SlurmUser: the hooks run as it. A spooled request (spool_dir) is acted on "
        "only if root, the daemon's user or this user wrote it, in directories none but "
        "they and this group can change; any other is moved to rejected/ and logged.",
        default="slurm",
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
    spool_dir: str = doc(
        "Where a hook writes a request the state database cannot take (locked past "
        "hook_db_timeout, its disk full): a directory on another filesystem than "
        "state_dir (the default is on /run, a tmpfs). Made 2770 in SlurmUser's group: "
        "the hooks write, the daemon drains each file into the database and removes it.",
        default="/run/slurm-burst/spool",
    )
    hook_db_timeout: float = doc(
        "Seconds a hook waits for the state database's write lock before it writes its "
        "request to spool_dir instead (Slurm's power-save thread waits on the hook).",
        default=3.0,
    )
    syslog: str = doc(
        "Socket of the system log (journald or syslog) where hooks also log their errors: "
        "a request they could not record, nodes they set DOWN. Empty: none.",
        default="/dev/log",
    )
    workers: int = doc(
        "Threads that launch, tear down and check on nodes (a node waiting for its "
        "instance to boot holds none).",
        default=64,
    )
    bootstrap_slots: int = doc(
        "Nodes bootstrapped over SSH at the same time. 1,000 nodes whose bootstrap takes "
        "10 s join in about 50 s with 200.",
        default=200,
    )
    name_each_max: int = doc(
        "Launches of at most this many instances have each instance named after its node "
        "(a CreateTags call per instance, in the background); a larger launch names its "
        "instances at launch, all alike, after the launch's nodes (a hostlist): no call "
        "per instance, where 1,000 would take over two minutes of the account's CreateTags "
        "budget. `slurm-burst nodes --json` maps nodes to instances either way. 0: never "
        "one by one.",
        default=100,
    )
    api_share: float = doc(
        "Share of the provider's documented API refill rates the daemon keeps to (the "
        "account's budget is shared with consoles and other tools); 0 < share <= 1.",
        default=0.75,
    )
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
    lost_resume_grace: float = doc(
        "Seconds a node Slurm is powering up may go without a resume reaching the daemon "
        "before it fails with ResumeLost (at least twice poll_period is used).",
        default=60.0,
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
    metrics_max_accounts: int = doc(
        "Accounts with spend series of their own (the biggest spenders); the rest are "
        "summed as account '_other', so the series stay bounded.",
        default=100,
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
class GpuConfig:
    node_python: str = doc(
        "Python on the GPU nodes that has nvidia-ml-py (the node_image role installs it "
        "there); it runs the GPU check and the telemetry sampler.",
        default="/opt/slurm-burst/node/bin/python3",
    )
    health_check_program: str = doc(
        "Where burst nodes get the GPU check as Slurm's HealthCheckProgram (conf render "
        "then sets it in slurm.conf; every node needs a program there, see the docs). "
        "'': HealthCheckProgram is left to the site.",
        default="",
    )
    health_check_chain: str = doc(
        "The site's own HealthCheckProgram (e.g. /usr/sbin/nhc), run first on burst nodes.",
        default="",
    )
    health_check_interval: int = doc("HealthCheckInterval (seconds).", default=300)
    critical_xids: tuple[int, ...] = doc(
        "XIDs that keep a GPU node out (kernel log since boot, NVML events).",
        default=(48, 61, 62, 64, 74, 79, 92, 95, 119, 120, 140),
    )
    kernel_log: str = doc(
        "Where the GPU check reads the node's kernel log for NVRM Xid lines: /dev/kmsg, or "
        "a file (e.g. /var/log/kern.log where /dev/kmsg cannot be read).",
        default="/dev/kmsg",
    )
    telemetry_interval: float = doc(
        "Seconds between GPU samples (utilization, memory, power) of joined GPU nodes, "
        "over SSH; 0: no telemetry.",
        default=30.0,
    )
    per_gpu_metrics: bool = doc(
        "Export one series per node and GPU (cardinality grows with the fleet); by default "
        "metrics are aggregated per node group.",
        default=False,
    )


@dataclass(frozen=True)
class PolicyOverride:
    name: str = doc("Account, QOS or partition (the table key).")
    min_wait: float | None = doc("Overrides policy.min_wait.", default=None)
    wait_per_dollar: float | None = doc("Overrides policy.wait_per_dollar.", default=None)
    wait_factor: float | None = doc("Overrides policy.wait_factor.", default=None)
    max_job_cost: float | None = doc("Overrides policy.max_job_cost.", default=None)
    burst_share: float | None = doc("Overrides policy.burst_share.", default=None)
    onprem_only: bool | None = doc(
        "Never burst (sensitive data); Slurm is told too (conf render).", default=None
    )


@dataclass(frozen=True)
class PolicyConfig:
    enabled: bool = doc(
        "The daemon decides for pending jobs of slurm.onprem_partitions, and adds a burst "
        "partition to those that should burst. Off: only jobs submitted to a burst "
        "partition burst (Slurm's own rule).",
        default=False,
    )
    interval: float = doc("Seconds between the daemon's policy passes.", default=30.0)
    groups: tuple[str, ...] = doc(
        "The node groups the policy may send jobs to (the cheapest that fits wins); "
        "empty: every group.",
        default=(),
    )
    spend_cap: float = doc(
        "Dollars a calendar month, all accounts together: no job bursts past it "
        "(the ledger's spend and running jobs' commitments count); 0: no cap.",
        default=0.0,
    )
    min_wait: float = doc(
        "Seconds: a job never bursts for a shorter expected on-prem wait.", default=600.0
    )
    wait_per_dollar: float = doc(
        "Seconds of expected on-prem wait each dollar of the job's cloud cost (its nodes "
        "for its time limit and the boot) must save: a job bursts when its wait is "
        "longer than this times its cost (3600: an hour a dollar).",
        default=3600.0,
    )
    wait_factor: float = doc(
        "And only when its expected wait is longer than this times its time limit "
        "(0: no such condition).",
        default=0.0,
    )
    max_job_cost: float = doc(
        "Dollars: a job whose cloud cost (at its time limit) is higher never bursts; 0: no cap.",
        default=0.0,
    )
    recheck: float = doc("Seconds between looks at a job that waits.", default=300.0)
    burst_share: float = doc(
        "0: off. Else (0 < share < 1) a job's wait_per_dollar is at most the bar that "
        "this share of the jobs that waited over the last week (at least the last 50) "
        "passed (their expected wait per dollar, each counted once, at its first "
        "decision): the bar follows the load, "
        "so about that share of the waiting jobs bursts in a busy month as in a quiet one "
        "(`slurm-burst policy tune` weighs it against a fixed wait_per_dollar).",
        default=0.0,
    )
    boot_estimate: float = doc(
        "Seconds from launch to a job running on its cloud nodes (costs, the simulator).",
        default=180.0,
    )
    accounts: Mapping[str, PolicyOverride] = doc(
        "Per-account settings (the most specific wins: account, then QOS, then partition).",
        default_factory=_empty,
    )
    qos: Mapping[str, PolicyOverride] = doc("Per-QOS settings.", default_factory=_empty)
    partitions: Mapping[str, PolicyOverride] = doc(
        "Per-partition settings.", default_factory=_empty
    )

    def onprem_only(self) -> tuple[list[str], list[str]]:
        """The accounts and the QOS whose jobs and data never leave the site, sorted and
        lower-cased: Slurm compares both names without regard to case."""
        return (
            sorted(a.lower() for a, o in self.accounts.items() if o.onprem_only),
            sorted(q.lower() for q, o in self.qos.items() if o.onprem_only),
        )

    def rule(self, account: str = "", qos: str = "", partition: str = "") -> Rule:
        """The policy a job of ``account``, ``qos`` and ``partition`` is decided by."""
        values: dict[str, Any] = {
            "min_wait": self.min_wait,
            "wait_per_dollar": self.wait_per_dollar,
            "wait_factor": self.wait_factor,
            "max_job_cost": self.max_job_cost or None,
            "onprem_only": False,
            "burst_share": self.burst_share,
        }
        # accounts and QOS as Slurm compares them, without regard to case
        for table, key, fold in ((self.partitions, partition, False), (self.qos, qos, True),
                                 (self.accounts, account, True)):  # fmt: skip
            o = _named(table, key, fold) if key else None
            if o is None:
                continue
            for name in ("min_wait", "wait_per_dollar", "wait_factor", "max_job_cost",
                         "onprem_only", "burst_share"):  # fmt: skip
                value = getattr(o, name)
                if value is not None:  # a max_job_cost of 0 lifts the cap
                    values[name] = (value or None) if name == "max_job_cost" else value
        return Rule(recheck=self.recheck, **values)


def _named(table: Mapping[str, PolicyOverride], key: str, fold: bool) -> PolicyOverride | None:
    if not fold:
        return table.get(key)
    return next((o for name, o in table.items() if name.lower() == key.lower()), None)


@dataclass(frozen=True)
class ImageConfig:
    name: str = doc("Image key (the table key), as node groups' images name it.")
    ref: str = doc(
        "The image's name as jobs run it, without tag or digest (e.g. "
        "'registry.example.org/ml/pytorch'): a node holds it as REF:<digest's first 16 "
        "hex> and REF@DIGEST, so that jobs run 'podman run REF@DIGEST' on both sides."
    )
    digest: str = doc(
        "The digest of the image's manifest (sha256:<64 hex>; for a multi-platform "
        "image, the platform's manifest): the only content that runs under this key."
    )
    layout: str = doc(
        "An OCI image layout on the daemon's host that holds it (skopeo copy "
        "docker://REF@DIGEST oci:DIR, or podman save --format oci-dir): the daemon ships "
        "the pinned image's blobs from there, through the staging store."
    )


@dataclass(frozen=True)
class StoreConfig:
    name: str = doc("Store name (the table key).")
    bucket: str = doc(
        "Bucket staged data goes to (made beforehand, private); none for a mesh store.",
        default="",
    )
    driver: str = doc(
        "Storage driver: 's3' (AWS S3, or an S3-compatible server at endpoint), "
        "'google_storage' (Cloud Storage's S3-compatible XML API with a service account's "
        "HMAC key; grants are V4 signed URLs), 'azure_blobs' (bucket: the container; "
        "credentials: the account and its key; grants are service SAS) or 'mesh' (no "
        "object storage: directory, on the controller, served by the daemon to the nodes "
        "through the WireGuard mesh; grants are HMAC-signed URLs).",
        default="s3",
    )
    directory: str = doc(
        "mesh: the directory on the controller that holds the store (made 0700 by the "
        "daemon; on a disk with room for every account's datasets and outputs).",
        default="",
    )
    region: str = doc("The bucket's region (request signing).", default="us-east-1")
    endpoint: str = doc(
        "HOST or HOST:PORT of an S3-compatible server; empty: AWS's endpoint of region. "
        "mesh: the HOST:PORT the daemon serves the store on, an address of the mesh "
        "(empty: the hub's, port 8479).",
        default="",
    )
    secure: bool = doc("HTTPS to the store (and in the nodes' URLs).", default=True)
    prefix: str = doc(
        "Key prefix of everything slurm-burst stores (ends with '/'; '' for none).",
        default="slurm-burst/",
    )
    credentials: Credentials | None = doc(
        "Where the store's keys are (never inline): file (TOML key/secret/token, 0600), "
        "key_env/secret_env, or AWS's standard environment. Nodes never get them.",
        default=None,
    )
    providers: tuple[str, ...] = doc(
        "Provider profiles whose nodes pull from this store (one store per provider).",
        default=(),
    )
    upload_per_gb: float = doc(
        "Dollars per GB (2^30 bytes) the provider charges for data sent into the store "
        "(stage-in's push; most charge none). Recorded with each transfer in the ledger.",
        default=0.0,
    )
    download_per_gb: float = doc(
        "Dollars per GB a cloud node's pull from the store costs (none within the "
        "store's region on the major providers; set it for a node in another region).",
        default=0.0,
    )
    egress_per_gb: float = doc(
        "Dollars per GB leaving the provider for the site (stage-out).", default=0.0
    )
    storage_per_gb_month: float = doc(
        "Dollars per GB-month stored (2^30 bytes for 730 hours); 'slurm-burst stage gc' "
        "books what each account's namespace held since its last run.",
        default=0.0,
    )


@dataclass(frozen=True)
class StagingConfig:
    store: str = doc(
        "The store 'slurm-burst stage push' uses when --store is not given (one of stores).",
        default="",
    )
    transfers: int = doc("Files hashed or sent at once.", default=4)
    bandwidth_mbit: float = doc(
        "Megabits a second for all uploads together (the site's WAN share); 0: no limit.",
        default=0.0,
    )
    link_mbit: float = doc(
        "Megabits a second the burst policy expects a job's data to cross the site's link "
        "at (bandwidth_mbit, when set and lower, wins): the time to move it is added to "
        "the wait a job must save; 0: the policy does not count staged data.",
        default=1000.0,
    )
    compress: bool = doc(
        "Store a file zlib-compressed when a sample of it shrinks by a tenth.", default=True
    )
    grant_seconds: int = doc(
        "How long a node's read-only object URLs last (60 s to 7 days).", default=900
    )
    onprem_only_paths: tuple[str, ...] = doc(
        "Directories whose data never leaves the site (resolved: every way to them counts). "
        "policy.accounts.*.onprem_only and policy.qos.*.onprem_only keep theirs home too.",
        default=(),
    )
    marker: str = doc(
        "A file of this name in a directory keeps it and everything under it on-prem "
        "(a data owner's own way to say so).",
        default=".slurm-burst-onprem-only",
    )
    node_dir: str = doc(
        "Directory on cloud nodes under which each job's staged data appears.",
        default="/var/lib/slurm-burst/stage",
    )
    keep_days: float = doc(
        "'slurm-burst stage gc' removes a dataset version pushed more than this many days "
        "ago that no job the daemon knows of holds (it is sent again when next asked for).",
        default=30.0,
    )
    release_deadline: float = doc(
        "Seconds a suspended cloud node is kept for the outputs of its jobs (#BB_LUA "
        "stage_out) to come home; past it the node is released and what did not come home "
        "is recorded as lost (60 s to 1 day).",
        default=1800.0,
    )


def burst_partitions(groups: Mapping[str, NodeGroup]) -> list[str]:
    """The node groups' partitions, each once, in the order the groups name them."""
    return list(dict.fromkeys(g.partition for g in groups.values()))


class NodeNames:
    """Which node group a node name is, read from the groups' patterns (no list of every
    name: a group's names need not be expanded to be known). A name is a group's when it
    is the pattern with a decimal index written as the pattern writes it (``gpu-007`` for
    ``gpu-{n:03d}``, never ``gpu-7``) and the index is in the group's range; the config
    check refuses groups whose names overlap. Answers are remembered (Slurm names the
    same nodes every pass)."""

    MEMO = 1_000_000  # names remembered at most (a listing of garbage names stops there)
    DIGITS = 9  # the longest index read (a group has at most MAX_GROUP_NODES)

    def __init__(self, groups: Mapping[str, NodeGroup]) -> None:
        self._parts = []
        for g in groups.values():
            m = _PATTERN.fullmatch(g.pattern)
            if m is not None:
                self._parts.append((g, m.group("pre"), m.group("post")))
        self._memo: dict[str, NodeGroup | None] = {}

    def index_of(self, node: str) -> tuple[NodeGroup, int] | None:
        """The node's group and its index there; None for a name of no group."""
        for g, pre, post in self._parts:
            digits = node[len(pre) : len(node) - len(post)] if node.startswith(pre) else ""
            if (
                digits
                and node.endswith(post)
                and len(digits) <= self.DIGITS
                and digits.isascii()
                and digits.isdigit()
                and 1 <= (i := int(digits)) <= g.count
                and g.node_name(i) == node
            ):
                return g, i
        return None

    def group_of(self, node: str) -> NodeGroup | None:
        try:
            return self._memo[node]
        except KeyError:
            pass
        found = self.index_of(node)
        group = found[0] if found is not None else None
        if len(self._memo) < self.MEMO:
            self._memo[node] = group
        return group


@dataclass(frozen=True)
class Fleet:
    """The cluster's cloud node groups and their prices: what the services look a node up
    in (``Config.fleet``, built once per config)."""

    cluster: str
    node_groups: Mapping[str, NodeGroup]
    rate_table: RateTable
    names: NodeNames = field(repr=False, compare=False)

    def group_of(self, node: str) -> NodeGroup | None:
        """The node group ``node`` is of, or None for a node we do not manage."""
        return self.names.group_of(node)

    def burst_partitions(self) -> list[str]:
        return burst_partitions(self.node_groups)


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
    gpu: GpuConfig = doc("GPU checks (NVML) and telemetry.", default=GpuConfig())
    policy: PolicyConfig = doc(
        "The burst policy: which pending jobs go to the cloud (the simulator uses it).",
        default=PolicyConfig(),
    )
    stores: Mapping[str, StoreConfig] = doc(
        "Object storage for staged data, per provider and region.", default_factory=_empty
    )
    staging: StagingConfig = doc(
        "Data that follows the job (stage-in through object storage).",
        default=StagingConfig(),
    )
    images: Mapping[str, ImageConfig] = doc(
        "Container images the site's jobs run, by digest (docs/runtime.md): a node "
        "group's images reach its nodes through the staging store before they join.",
        default_factory=_empty,
    )
    # plugins' own sections (slurm_burst.extensions.ConfigSection), by name, as built
    extensions: Mapping[str, Any] = field(default_factory=_empty, metadata={"internal": True})
    source: str = field(default="<string>", metadata={"internal": True})

    def section(self, name: str) -> Any:
        """A plugin's section of this config (its own dataclass); None if absent."""
        return self.extensions.get(name)

    def burst_partitions(self) -> list[str]:
        return burst_partitions(self.node_groups)

    def rate_list(self) -> list[Rate]:
        """Every price as a core Rate: node groups' price_per_hour, then [rates.*].

        A group's ``price_per_hour`` is a rate valid since 1970; a [rates] entry for
        the same size starts later and so wins from its ``valid_from`` on. Prices are
        per size: groups that share a size give it once, or again at the same price. Entries
        whose dates or prices do not parse are left out (validation reports them).
        """
        out = []
        listed: dict[str, int] = {}  # size -> price: groups sharing a size may repeat it
        for g in self.node_groups.values():
            for size, price in g.price_per_hour.items():
                with contextlib.suppress(PricingError):
                    micros = to_micros(price)
                    if listed.get(size) == micros:
                        continue  # the same price again: one rate (a different one is ambiguous)
                    listed.setdefault(size, micros)
                    out.append(Rate(f"node_groups.{g.name}.price_per_hour.{size}", size, micros))
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

    @cached_property
    def fleet(self) -> Fleet:
        return Fleet(self.cluster.name, self.node_groups, self.rate_table,
                     NodeNames(self.node_groups))  # fmt: skip

    def gpus_of_size(self, size: str) -> int:
        """GPUs of the node group(s) using ``size`` (0 for a CPU size)."""
        return max((g.gpus for g in self.node_groups.values() if size in g.size_names), default=0)

    def group_of(self, node: str) -> NodeGroup | None:
        """The node group defining ``node``, or None for a node we do not manage."""
        return self.fleet.group_of(node)
