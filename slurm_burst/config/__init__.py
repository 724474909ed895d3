"""Typed configuration: one TOML file loaded once into frozen dataclasses.

``load_config(path)`` returns a :class:`Config` or raises :class:`ConfigError`
listing every problem with its key path and line; ``check_config`` returns the
problems (warnings included) for ``slurm-burst config check``.
"""

from slurm_burst.config.load import (
    DEFAULT_CONFIG_PATH,
    ConfigError,
    check_config,
    load_config,
    resolve_config_path,
)
from slurm_burst.config.model import (
    ClusterConfig,
    Config,
    Credentials,
    DaemonConfig,
    Fleet,
    GpuConfig,
    ImageConfig,
    LedgerConfig,
    MeshConfig,
    NodeGroup,
    PartitionConfig,
    PolicyConfig,
    ProviderConfig,
    RateConfig,
    SlurmConfig,
)
from slurm_burst.config.schema import Problem

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "Credentials",
    "DaemonConfig",
    "Fleet",
    "GpuConfig",
    "ImageConfig",
    "LedgerConfig",
    "MeshConfig",
    "NodeGroup",
    "PartitionConfig",
    "PolicyConfig",
    "Problem",
    "ProviderConfig",
    "RateConfig",
    "SlurmConfig",
    "check_config",
    "load_config",
    "resolve_config_path",
]
