"""Make our namespace cloud a libcloud provider like any other.

``libcloud.compute.providers.get_driver("nscloud")`` then works everywhere,
so nothing above the cloud adapter can tell the lab from a real provider.
"""

from __future__ import annotations

from typing import Any

from libcloud.compute.providers import DRIVERS, get_driver, set_driver

NSCLOUD = "nscloud"
_MODULE = "slurm_burst.lab.nscloud.driver"


def register() -> None:
    """Register the namespace cloud with libcloud (idempotent)."""
    if NSCLOUD not in DRIVERS:
        # libcloud's stubs say module/type; at run time it takes dotted names, as documented.
        set_driver(NSCLOUD, _MODULE, "NamespaceNodeDriver")  # type: ignore[arg-type]


def driver_class(name: str) -> Any:
    register()
    return get_driver(name)


def driver_exists(name: str) -> bool:
    try:
        driver_class(name)
    except (AttributeError, ImportError, KeyError, ValueError):
        return False
    return True
