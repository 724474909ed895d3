"""A provider is one module: what slurm-burst knows of one kind of cloud.

Each built-in provider is a module of this package whose ``PROVIDER`` is a
:class:`Provider`: ``ec2``, ``gce``, ``azure_arm``, ``openstack``. A plugin's driver
(:class:`slurm_burst.extensions.CloudDriver`) and any other libcloud driver get one from
:mod:`slurm_burst.adapters.cloud.registry`, which is where the config checks, the wiring
and the services ask. Nothing outside a provider's own module tests for its name.

A description says, for its provider:

- **launching**: the ``create_node`` arguments of one launch (:meth:`Provider.launch_args`),
  how many instances one call may make (``launch_batch``: EC2's RunInstances with
  MinCount/MaxCount makes a whole job in one call), whether the daemon's key is imported
  as a key pair first, whether spot is offered and which per-job placement (EC2's
  cluster placement groups, GCE's compact placement policies) and how it is made;
- **reading**: whether a listing filters by tag on the server, whether booting nodes read
  one shared fleet listing (:meth:`Provider.list_fleet`), the provider's API behind each of
  our calls and its rate table (``api_names``, ``api_table``);
- **host keys**: the sources its API offers (the first the default) and their read rate;
- **interruption notices**: whether its instances hear of a reclaim beforehand: the
  node agent's arguments that read it where the provider serves it
  (``interruption_notices``);
- **credentials**: its standard environment and the credential file's extra keys;
- **the config**: what ``config check`` asks of a profile and of a group on it.

Importing a provider's module imports no cloud library (the hooks check the config):
libcloud is imported inside the methods that talk to a driver.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from slurm_burst.core.cloud import CloudError, NotFoundError

if TYPE_CHECKING:
    from libcloud.compute.base import Node, NodeSize

    from slurm_burst.adapters.cloud.attest import HostKeySource
    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.config.model import NodeGroup, ProviderConfig
    from slurm_burst.core.cloud import Instance, LaunchSpec
    from slurm_burst.core.ratelimit import ApiTable

log = logging.getLogger(__name__)

NONE: Mapping[str, Any] = MappingProxyType({})
# where EC2's instance metadata service and GCE's metadata server answer an instance
# (metadata.google.internal, by the address: the agent needs no DNS for it)
METADATA = "http://169.254.169.254"
# a config problem a provider finds: the key under the profile or group, and what is wrong
Finding = tuple[str, str]


class Provider:
    """A kind of cloud, as slurm-burst uses it: the generic libcloud driver's behaviour,
    which a provider's module overrides where its API does better or differs."""

    name: str = ""
    # -- launching
    launch_batch: int = 1  # instances one launch call may make
    imports_key_pair: bool = False  # the daemon's key is imported once, then named
    spot: bool = False  # LaunchSpec.spot is honoured
    placements: tuple[str, ...] = ()  # per-job placement kinds (create/delete_placement)
    destroy_kwargs: Mapping[str, Any] = NONE  # destroy_node's extra arguments
    # -- reading
    tag_filter: bool = False  # list_nodes(ex_filters={"tag:K": V}) filters on the server
    lists_fleet: bool = False  # booting nodes read one shared listing (list_fleet)
    api_names: Mapping[str, str] = NONE  # our call -> the provider's API, throttled per API
    # -- host keys: source name -> "module:factory(driver)"; the first is the default
    host_key_sources: Mapping[str, str] = NONE
    host_key_reads_per_second: float = 5.0
    # -- interruption notices: the node agent's (node/agent.py) arguments that make it
    # read of a reclaim beforehand where the provider serves it; (): none
    interruption_notices: tuple[str, ...] = ()
    # -- credentials: constructor argument -> the standard environment's variable
    needs_credentials: bool = True
    standard_env: Mapping[str, str] = NONE
    optional_env: Mapping[str, str] = NONE
    file_extras: tuple[str, ...] = ()  # credential-file keys passed on besides key, secret

    def __init__(self, name: str = "") -> None:
        if name:
            self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- the config ------------------------------------------------------------------
    @property
    def default_host_key_source(self) -> str:
        return next(iter(self.host_key_sources), "")

    def api_table(self) -> ApiTable | None:
        """The provider's documented API buckets (None: only the profile's own limits)."""
        return None

    def budget_scope(self, prov: ProviderConfig) -> tuple[str, ...]:
        """What the provider counts calls against: profiles with the same scope share
        one budget. By default an account in a region: driver, region, credentials and
        endpoint."""
        creds = prov.credentials
        return (
            prov.driver, prov.region,
            (creds.file or creds.key_env) if creds else "",
            str(prov.options.get("host", "")), str(prov.options.get("port", "")),
        )  # fmt: skip

    def profile_problems(self, prov: ProviderConfig) -> list[Finding]:
        """What a provider profile lacks for this provider (keys under the profile)."""
        return []

    def group_problems(self, group: NodeGroup) -> list[Finding]:
        """What a node group asks that this provider cannot give (keys under the group)."""
        return []

    def group_warnings(self, group: NodeGroup) -> list[Finding]:
        """What the provider documents against a node group's settings, short of
        refusing them (keys under the group)."""
        return []

    # -- the driver --------------------------------------------------------------------
    def construct(
        self, cls: Any, prov: ProviderConfig, kwargs: dict[str, Any], key: str, secret: str
    ) -> Any:
        """The driver: ``cls(key, secret, region=..., **options)`` unless overridden."""
        if prov.region:
            kwargs["region"] = prov.region
        return cls(key, secret, **kwargs)

    def prepare(self, driver: Any) -> None:
        """Adjust a newly built driver (once), before the daemon's first call."""

    def credentials_from_env(self, env: Mapping[str, str], where: str) -> dict[str, Any] | None:
        """Credentials from an environment that is not plain variables (None: use
        :attr:`standard_env`)."""
        return None

    def host_key_source(self, driver: Any, name: str = "") -> HostKeySource:
        """The source named ``name`` (default: the first); NoSource if it has none."""
        from slurm_burst import extensions
        from slurm_burst.adapters.cloud.attest import NoSource

        name = name or self.default_host_key_source
        target = self.host_key_sources.get(name)
        if target is None:
            raise NoSource(f"driver {self.name!r} has no host-key source {name or '(none)'!r}")
        source: HostKeySource = extensions.resolve(target)(driver)
        return source

    def launch_args(
        self, driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tags: Mapping[str, str]
    ) -> dict[str, Any]:
        """``create_node`` arguments of one launch: those its ``create_node`` takes."""
        import inspect

        from libcloud.compute.base import NodeAuthSSHKey

        from slurm_burst.adapters.cloud.profiles import image

        params = inspect.signature(driver.create_node).parameters
        accepts = set(params)
        if any(x.kind is inspect.Parameter.VAR_KEYWORD for x in params.values()):
            accepts |= {"auth", "ex_userdata", "ex_metadata"}  # a wrapper passing all through
        kw: dict[str, Any] = {"name": spec.node, "size": size, "image": image(driver, spec)}
        if "auth" in accepts:
            kw["auth"] = NodeAuthSSHKey(spec.ssh_public_key)
        if "ex_userdata" in accepts:
            kw["ex_userdata"] = spec.user_data
        if "ex_metadata" in accepts:
            kw["ex_metadata"] = dict(tags)
        elif "ex_tags" in accepts:
            kw["ex_tags"] = dict(tags)
        if "ex_token" in accepts:
            kw["ex_token"] = spec.token
        return kw

    def watch(self, cloud: LibcloudCloud) -> None:
        """Attach the provider's own connection to ``cloud`` (once, after
        :meth:`prepare`): where its API says what is left of its limits in every answer
        (Azure), each request takes its turn through ``cloud.meter``."""

    # -- calls on a cloud (libcloud's errors are typed by the caller) ------------------
    def find(self, cloud: LibcloudCloud, token: str, cluster: str) -> list[Instance] | None:
        """The live instances a launch with ``token`` made, where the provider finds them
        its own way (None: by the token's tag in a listing). Azure: [] (a repeat of the
        launch is idempotent, and finds what the first made)."""
        return None

    def launch_one(self, cloud: LibcloudCloud, spec: LaunchSpec) -> Instance | None:
        """A single node's launch where the driver's ``create_node`` cannot make it (GCE:
        a profile with a region and no zone); None: ``create_node``."""
        return None

    def launch_many(self, cloud: LibcloudCloud, spec: LaunchSpec) -> list[Instance] | None:
        """A batch's launch where the provider's API does better than its driver's
        ``create_node`` (GCE: one bulkInsert, instances named after their nodes); None:
        ``create_node``."""
        return None

    def create_placement(self, cloud: LibcloudCloud, name: str) -> None:
        """Make the per-job placement ``name`` (the driver's ``ex_create_placement_group``:
        EC2's, a plugin driver's). Raises ExistsError for one made already."""
        cloud.driver_call("ex_create_placement_group", name)

    def delete_placement(self, cloud: LibcloudCloud, name: str) -> None:
        """Delete placement ``name``: NotFoundError if it is gone, InUseError while an
        instance is still in it."""
        cloud.driver_call("ex_delete_placement_group", name)

    def tag(self, cloud: LibcloudCloud, instance_id: str, tags: Mapping[str, str]) -> None:
        setter = getattr(cloud.driver, "ex_create_tags", None)
        if setter is None:
            raise CloudError(f"{cloud.name}: driver {self.name} cannot tag", "NotSupported")
        node = cloud.node(instance_id)
        if node is None:
            raise NotFoundError(f"{cloud.name}: instance {instance_id} not found")
        setter(node, dict(tags))

    def list_fleet(
        self, cloud: LibcloudCloud, cluster: str, before_page: Callable[[], None]
    ) -> list[Instance]:
        """The cluster's instances that are not terminated (one listing: one page)."""
        before_page()
        return [i for i in cloud.list_instances(cluster) if i.state != "terminated"]

    def host_key_node(self, cloud: LibcloudCloud, instance_id: str, size: str) -> Node | None:
        """The node a host-key source reads (None: the instance is gone)."""
        return cloud.node(instance_id)

    def terminate(self, cloud: LibcloudCloud, instance_id: str) -> bool:
        """Destroy the instance; False if it was gone already."""
        from slurm_burst.adapters.cloud.compute import state_of

        node = cloud.node(instance_id)
        if node is None or state_of(node) == "terminated":
            return False
        cloud.driver.destroy_node(node, **self.destroy_kwargs)
        return True


def split_endpoint(url: str) -> tuple[bool, str, int]:
    """``https://HOST[:PORT]`` (or ``http://`` on loopback alone): (secure, host, port).
    ValueError, saying what is wrong, for anything else."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from None
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not host or parts.path not in ("", "/"):
        raise ValueError(f"{url!r}: give https://HOST[:PORT], no path")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{url!r}: give https://HOST[:PORT], nothing more")
    secure = parts.scheme == "https"
    if not secure and host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"{url!r}: plain http only on this host (127.0.0.1): use https")
    return secure, host, port or (443 if secure else 80)
