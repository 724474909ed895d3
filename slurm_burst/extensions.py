"""Extension points: how a separate package adds to slurm-burst without the product
knowing it (the lab is one such package; a site's own cloud driver could be another).

A package declares one entry point in the group ``slurm_burst.plugins`` whose object is a
:class:`Plugin`. A plugin may add:

- **cloud drivers** (:class:`CloudDriver`): a libcloud ``NodeDriver`` registered under a
  name that provider profiles then use as ``driver``, with what the daemon needs to know of
  it (its host-key sources, its read rate, whether it needs credentials, filters by tag,
  offers spot, makes placement groups);
- **config sections** (:class:`ConfigSection`): a top-level table of the config file,
  built into the plugin's own frozen dataclass and checked by the plugin's validator; the
  product's sections refuse unknown keys, and so does a plugin's;
- **driver wrappers**: a callable ``wrap(cfg, provider_name, driver) -> driver`` applied
  to every driver the product builds (a fault injector, an audit log of cloud calls);
- **commands**: ``slurm-burst NAME`` groups, as ``"module:attribute"``.

Everything a plugin names is a ``"module:attribute"`` string imported only when used, so
the hooks (which read the config, and so load plugins) pay for no cloud library. This
module imports nothing beyond the standard library and ``slurm_burst.core`` (the
built-in providers' names, which no plugin may take, are looked up when plugins load).
What the product makes of a plugin's driver is in :mod:`slurm_burst.adapters.cloud.registry`.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from slurm_burst.core.errors import EXIT_BAD_INPUT, BurstError

GROUP = "slurm_burst.plugins"
_EMPTY: Mapping[str, str] = {}


class ExtensionError(BurstError):
    """A plugin that cannot be loaded or that contradicts another (named in the message)."""

    code = "ExtensionError"
    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class CloudDriver:
    """A libcloud compute driver a plugin adds, and what the daemon needs to know of it."""

    name: str  # the provider profiles' ``driver``
    target: str  # "module:Class" of its NodeDriver
    # host-key source name -> "module:factory" (factory(driver) -> a HostKeySource); the
    # first is the default (core.hostkeys describes the sources)
    host_key_sources: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    reads_per_second: float = 5.0  # host-key reads per second by default
    credentials: bool = True  # False: the constructor takes no key and secret
    tag_filter: bool = False  # list_nodes(ex_filters={"tag:K": V}) filters on the server
    spot: bool = False  # LaunchSpec.spot is honoured
    # LaunchSpec.placement_group is honoured, and the driver has libcloud EC2's
    # ex_create_placement_group(name) and ex_delete_placement_group(name)
    placement: bool = False
    # "module:function(driver, spec, placement, size, tags) -> create_node kwargs";
    # '' : the generic mapping (the arguments its create_node takes)
    launch_args: str = ""
    # "module:function(cls, provider, options) -> driver"; '' : cls(key, secret, **options)
    construct: str = ""


@dataclass(frozen=True)
class ConfigSection:
    """A top-level config table a plugin owns: ``[name]``."""

    name: str
    model: type  # a frozen dataclass whose fields are built like the product's
    # "module:function(section, cfg) -> list[Problem]"; '' : no checks beyond the types
    validate: str = ""


@dataclass(frozen=True)
class Plugin:
    name: str
    clouds: tuple[CloudDriver, ...] = ()
    sections: tuple[ConfigSection, ...] = ()
    driver_wrappers: tuple[str, ...] = ()  # "module:function(cfg, provider, driver)"
    commands: Mapping[str, str] = field(default_factory=lambda: _EMPTY)


_lock = threading.Lock()
_loaded: tuple[Plugin, ...] | None = None


def plugins() -> tuple[Plugin, ...]:
    """The installed plugins (entry points of :data:`GROUP`), loaded once per process."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _check(tuple(_load(ep) for ep in entry_points(group=GROUP)))
        return _loaded


def _load(ep: Any) -> Plugin:
    try:
        obj = ep.load()
    except Exception as exc:  # a plugin's import may fail in any way: name the plugin
        raise ExtensionError(
            f"plugin {ep.name!r} ({ep.value}) cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(obj, Plugin):
        raise ExtensionError(f"plugin {ep.name!r} ({ep.value}) is not a slurm_burst Plugin")
    return obj


def _check(found: tuple[Plugin, ...]) -> tuple[Plugin, ...]:
    """No two plugins claim one driver, section or command, nor a built-in one."""
    from slurm_burst.adapters.cloud.registry import built_in_names

    owner: dict[tuple[str, str], str] = {("driver", d): "slurm-burst" for d in built_in_names()}
    for p in found:
        claims = [("driver", c.name) for c in p.clouds]
        claims += [("section", s.name) for s in p.sections]
        claims += [("command", c) for c in p.commands]
        for claim in claims:
            if claim in owner:
                raise ExtensionError(
                    f"plugin {p.name!r} adds {claim[0]} {claim[1]!r}, which "
                    f"{owner[claim]!r} has already"
                )
            owner[claim] = p.name
    return found


def use(found: tuple[Plugin, ...] | None) -> None:
    """Replace the loaded plugins (tests; None loads the installed ones again)."""
    global _loaded
    with _lock:
        _loaded = None if found is None else _check(found)


def resolve(target: str) -> Any:
    """The object a ``"module:attribute"`` string names."""
    module, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ExtensionError(f"{target!r} cannot be imported: {exc}") from exc
    return obj


def cloud_driver(name: str) -> CloudDriver | None:
    """The plugin driver called ``name``; None for libcloud's own (and unknown) ones."""
    for p in plugins():
        for c in p.clouds:
            if c.name == name:
                return c
    return None


def config_section(name: str) -> ConfigSection | None:
    for p in plugins():
        for s in p.sections:
            if s.name == name:
                return s
    return None


def commands() -> dict[str, str]:
    return {name: target for p in plugins() for name, target in p.commands.items()}


def driver_wrappers() -> list[Callable[..., Any]]:
    return [resolve(w) for p in plugins() for w in p.driver_wrappers]
