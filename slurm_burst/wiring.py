"""The one place adapters are built from the configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_burst.adapters.cloud.registry import driver_class
from slurm_burst.adapters.slurm.cli import SlurmCli
from slurm_burst.config import Config, ProviderConfig


def scheduler(cfg: Config) -> SlurmCli:
    s = cfg.slurm
    return SlurmCli(
        bin_dir=s.bin_dir,
        slurm_conf=str(Path(s.conf_dir) / "slurm.conf"),
        timeout=s.command_timeout,
        batch=s.update_batch,
    )


def cloud_driver(provider: ProviderConfig) -> Any:
    """A libcloud driver for ``provider`` (credentials resolution comes with real providers)."""
    cls = driver_class(provider.driver)
    kwargs: dict[str, Any] = dict(provider.options)
    if provider.region:
        kwargs["region"] = provider.region
    return cls("lab" if provider.driver == "nscloud" else "", **kwargs)
