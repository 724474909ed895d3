"""Semantic checks of how a node group launches and talks: spot with an on-demand
fallback, placement per job, cloud-to-cloud tunnels. Pure: no file or network access."""

from __future__ import annotations

import math

from slurm_burst.adapters.cloud.registry import built_in, offering, provider
from slurm_burst.config.model import Config, NodeGroup
from slurm_burst.config.schema import Problem

CLOUD_TO_CLOUD = ("hub", "wireguard")
# what Slurm knows a node by: a fallback launching a group's nodes must offer the same
SHAPE = ("cpus", "memory_mb", "gpus", "gpu_type")


def launch_problems(cfg: Config) -> list[Problem]:
    out: list[Problem] = []
    for name, g in cfg.node_groups.items():
        base = f"node_groups.{name}"
        _spot_fallback(cfg, g, base, out)
        _placement(cfg, g, base, out)
        if g.cloud_to_cloud not in CLOUD_TO_CLOUD:
            out.append(Problem(f"{base}.cloud_to_cloud", "must be 'hub' or 'wireguard'"))
    for key in ("node_port", "api_port"):
        if not 1 <= getattr(cfg.mesh, key) <= 65_535:
            out.append(Problem(f"mesh.{key}", "must be a port, 1 to 65,535"))
    if not 0.5 <= cfg.mesh.sync_interval <= 3600:  # NaN fails both
        out.append(Problem("mesh.sync_interval", "must be 0.5 to 3,600 seconds"))
    return out


def _spot_fallback(cfg: Config, g: NodeGroup, base: str, out: list[Problem]) -> None:
    wait = g.spot_fallback_after
    if not (isinstance(wait, int | float) and math.isfinite(wait) and 0 <= wait <= 86_400):
        out.append(Problem(f"{base}.spot_fallback_after", "must be 0 to 86,400 seconds"))
        return
    if not g.spot_fallback:
        return
    where = f"{base}.spot_fallback"
    if not g.spot:
        out.append(Problem(where, "set on a group without spot; set spot = true or remove it"))
        return
    other = cfg.node_groups.get(g.spot_fallback)
    if other is None:
        out.append(Problem(where, f"no node group {g.spot_fallback!r}"))
        return
    if other.name == g.name or other.spot:
        out.append(Problem(where, f"node group {other.name!r} is spot: a fallback is on-demand"))
    if other.spot_fallback:
        out.append(Problem(where, f"node group {other.name!r} has a fallback of its own"))
    for key in SHAPE:
        mine, theirs = getattr(g, key), getattr(other, key)
        if mine != theirs:
            out.append(Problem(
                where,
                f"node group {other.name!r} has {key} {theirs!r}, this group {mine!r}: "
                "Slurm knows the nodes by this group's shape",
            ))  # fmt: skip
    boot = cfg.daemon.boot_timeout
    limit = cfg.slurm.resume_timeout
    if wait >= boot:
        out.append(Problem(
            f"{base}.spot_fallback_after",
            f"{wait:g} s is not less than daemon.boot_timeout {boot:g} s: a spot launch "
            "would fail with BootTimeout before it falls back",
        ))  # fmt: skip
    if wait + boot > limit:
        out.append(Problem(
            f"{base}.spot_fallback_after",
            f"{wait:g} s of waiting for spot capacity plus a boot of up to "
            f"daemon.boot_timeout {boot:g} s is past slurm.resume_timeout {limit} s: a node "
            f"falling back late would be failed by Slurm before it joins; use at most "
            f"{max(0.0, limit - boot):g}",
        ))  # fmt: skip


def placements() -> dict[str, str]:
    """Every placement kind a built-in provider offers -> the provider's name."""
    return {kind: name for name, p in built_in().items() for kind in p.placements}


def _placement(cfg: Config, g: NodeGroup, base: str, out: list[Problem]) -> None:
    kinds = placements()
    if g.placement and g.placement not in kinds:
        named = ", ".join(f"{k!r} ({p})" for k, p in sorted(kinds.items()))
        out.append(Problem(f"{base}.placement", f"must be {named} or '' (none)"))
        return
    if not g.placement:
        return
    if g.all_or_nothing != "job":
        out.append(Problem(
            f"{base}.placement",
            "needs all_or_nothing = 'job': a job's nodes launch together, or not at all",
        ))  # fmt: skip
    for pname in g.providers:
        prov = cfg.providers.get(pname)
        if prov is None:
            continue
        offered = provider(prov.driver).placements
        if g.placement not in offered:
            has = f"only {', '.join(map(repr, offered))}" if offered else "none"
            out.append(Problem(
                f"{base}.placement",
                f"provider {pname!r} ({prov.driver}) offers {has}: slurm-burst makes "
                f"placement per job on {', '.join(offering(lambda d: bool(d.placements)))} "
                "(and a plugin's driver that offers it); use a group without placement there",
            ))  # fmt: skip
