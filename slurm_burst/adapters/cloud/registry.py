"""libcloud's compute drivers, and the ones plugins add (slurm_burst.extensions), by name.

A plugin's driver is registered with libcloud (``set_driver``), so
``libcloud.compute.providers.get_driver(name)`` works for it as for libcloud's own, and
nothing above the cloud adapter can tell a plugin's driver from a real provider's.
"""

from __future__ import annotations

from typing import Any

from libcloud.compute.providers import DRIVERS, get_driver, set_driver

from slurm_burst import extensions


def register(name: str) -> None:
    """Register the plugin driver ``name`` with libcloud (idempotent; libcloud's own and
    unknown names are left to libcloud)."""
    plugin = extensions.cloud_driver(name)
    if plugin is not None and name not in DRIVERS:
        module, _, cls = plugin.target.partition(":")
        # libcloud's stubs say module/type; at run time it takes dotted names, as documented.
        set_driver(name, module, cls)  # type: ignore[arg-type]


def driver_class(name: str) -> Any:
    register(name)
    return get_driver(name)


def driver_exists(name: str) -> bool:
    try:
        driver_class(name)
    except (AttributeError, ImportError, KeyError, ValueError, extensions.ExtensionError):
        return False
    return True
