"""Providers by name: the built-in ones (each a module of
:mod:`slurm_burst.adapters.cloud.providers`), a plugin's driver (slurm_burst.extensions),
or any other libcloud compute driver, described as the generic one.

A plugin's driver is registered with libcloud (``set_driver``), so
``libcloud.compute.providers.get_driver(name)`` works for it as for libcloud's own, and
nothing above the cloud adapter can tell a plugin's driver from a real provider's.
Looking a provider up imports no cloud library (the hooks check the config).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from slurm_burst import extensions
from slurm_burst.adapters.cloud import providers
from slurm_burst.adapters.cloud.providers import Provider

if TYPE_CHECKING:
    from libcloud.compute.base import NodeSize

    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.core.cloud import LaunchSpec


@functools.cache
def built_in_names() -> frozenset[str]:
    """The product's own providers' names: the providers package's modules (each is
    named as its provider; a unit test says so), listed without importing them."""
    return frozenset(info.name for info in pkgutil.iter_modules(providers.__path__))


@functools.cache
def _built_in(name: str) -> Provider:
    described = importlib.import_module(f"{providers.__name__}.{name}").PROVIDER
    if not isinstance(described, Provider):
        raise TypeError(f"{providers.__name__}.{name}.PROVIDER is not a Provider")
    return described


def built_in() -> Mapping[str, Provider]:
    """The product's own providers by name (each module imported: no cloud library)."""
    return MappingProxyType({name: _built_in(name) for name in sorted(built_in_names())})


class PluginProvider(Provider):
    """A plugin's driver, as its :class:`~slurm_burst.extensions.CloudDriver` describes it."""

    def __init__(self, plugin: extensions.CloudDriver) -> None:
        super().__init__(plugin.name)
        self.plugin = plugin
        self.host_key_sources = plugin.host_key_sources
        self.host_key_reads_per_second = plugin.reads_per_second
        self.needs_credentials = plugin.credentials
        self.tag_filter = plugin.tag_filter
        self.spot = plugin.spot
        self.placements = ("cluster",) if plugin.placement else ()  # EC2's calls, by name

    def construct(self, cls: Any, prov: Any, kwargs: dict[str, Any], key: str, secret: str) -> Any:
        if self.plugin.construct:
            return extensions.resolve(self.plugin.construct)(cls, prov, kwargs)
        return super().construct(cls, prov, kwargs, key, secret)

    def launch_args(
        self, driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tags: Mapping[str, str]
    ) -> dict[str, Any]:
        if self.plugin.launch_args:
            built: dict[str, Any] = extensions.resolve(self.plugin.launch_args)(
                driver, spec, p, size, tags
            )
            return built
        return super().launch_args(driver, spec, p, size, tags)


def provider(name: str) -> Provider:
    """What slurm-burst knows of driver ``name``: a built-in provider, a plugin's driver,
    or (any other libcloud driver) the generic description."""
    if name in built_in_names():
        return _built_in(name)
    plugin = extensions.cloud_driver(name)
    return PluginProvider(plugin) if plugin is not None else Provider(name)


def offering(trait: Callable[[Provider], object]) -> list[str]:
    """The built-in providers that have ``trait``, by name (what a config error names
    as the alternatives)."""
    return sorted(name for name, p in built_in().items() if trait(p))


def host_key_sources(name: str) -> tuple[str, ...]:
    """The host-key sources driver ``name`` offers, the default first."""
    return tuple(provider(name).host_key_sources)


def register(name: str) -> None:
    """Register the plugin driver ``name`` with libcloud (idempotent; libcloud's own and
    unknown names are left to libcloud)."""
    from libcloud.compute.providers import DRIVERS, set_driver

    plugin = extensions.cloud_driver(name)
    if plugin is not None and name not in DRIVERS:
        module, _, cls = plugin.target.partition(":")
        # libcloud's stubs say module/type; at run time it takes dotted names, as documented.
        set_driver(name, module, cls)  # type: ignore[arg-type]


def driver_class(name: str) -> Any:
    from libcloud.compute.providers import get_driver

    register(name)
    return get_driver(name)


def driver_exists(name: str) -> bool:
    try:
        driver_class(name)
    except (AttributeError, ImportError, KeyError, ValueError, extensions.ExtensionError):
        return False
    return True
