"""Host-key sources: where a provider's API lets the daemon read a new instance's SSH
host keys (the bootstrap's trust anchor; see :mod:`slurm_burst.core.hostkeys`).

One source per provider profile, chosen by ``providers.*.host_keys`` (default: the first
its provider names, :attr:`~slurm_burst.adapters.cloud.providers.Provider.host_key_sources`).
Each ``read`` returns the keys, or ``[]`` while the instance has not published them yet;
any other failure is raised as the provider's error for :class:`LibcloudCloud` to type.
A provider's own sources live in its module (EC2's console, GCE's guest attributes and
serial port, Azure's boot diagnostics); this module holds what they share and
:class:`Console`, libcloud's ``ex_get_console_output`` (OpenStack's, and a plugin
driver's that has it).
"""

from __future__ import annotations

from typing import Any, Protocol

from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node

from slurm_burst.core.cloud import classify
from slurm_burst.core.hostkeys import parse_console_host_keys

Keys = list[tuple[str, str]]


class HostKeySource(Protocol):
    name: str

    def read(self, node: Node) -> Keys: ...


class NoSource(LibcloudError):
    """The driver offers no host-key source (``config check`` says so beforehand)."""


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a libcloud error (GCE keeps it apart from its reason code)."""
    for attr in ("http_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    return None


def throttled(exc: BaseException) -> bool:
    """A throttled answer (a code :func:`~slurm_burst.core.cloud.classify` retries, or
    HTTP 429/503, as the adapter types them): says nothing of what was asked."""
    return classify(str(exc)).retryable or http_status(exc) in (429, 503)


class Console:
    """libcloud's ``ex_get_console_output`` (OpenStack and drivers like it): cloud-init's block."""

    name = "console"

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def read(self, node: Node) -> Keys:
        fetch = getattr(self.driver, "ex_get_console_output", None)
        if fetch is None:
            raise NoSource(f"driver {self.driver.type} cannot read an instance console")
        out = fetch(node)
        if isinstance(out, dict):  # OpenStack {"output": ...}, libcloud's EC2 {"output": ...}
            out = out.get("output") or ""
        return parse_console_host_keys(str(out))
