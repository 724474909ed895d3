"""``slurm-burst lab``: bring the local hybrid lab up, down, or show it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slurm_burst.cli.common import (
    EXIT_FAILED,
    EXIT_PRECONDITION,
    FiniteRange,
    app,
    emit,
    fail,
    json_option,
)
from slurm_burst_lab import images
from slurm_burst_lab.service import Lab, LabError


@click.group("lab")
def group() -> None:
    """The local lab: real slurmctld and slurmd, a namespace cloud, one machine (root).

    \b
    Uses the config's [lab] section; the shipped one is slurm-conf/lab/slurm-burst.toml:
      sudo slurm-burst --config slurm-conf/lab/slurm-burst.toml lab up
      sudo slurm-burst --config slurm-conf/lab/slurm-burst.toml lab up --slurm 24.11
      export SLURM_CONF=/var/lib/slurm-burst-lab/etc/slurm/slurm.conf
      export PATH=/var/lib/slurm-burst-lab/slurm/bin:$PATH; sinfo
    """


def _lab(ctx: click.Context, quiet: bool = False, release: str | None = None) -> Lab:
    def progress(msg: str) -> None:
        if not quiet:
            click.echo(f"lab: {msg}", err=True)

    try:
        lab = Lab(app(ctx).config, progress=progress, release=release)
        lab.preflight()
    except LabError as exc:
        fail(str(exc), EXIT_PRECONDITION)
    return lab


@group.command("up")
@click.option(
    "--timeout",
    type=FiniteRange(1, 3600),
    default=60.0,
    show_default=True,
    help="Seconds to wait for Slurm.",
)
@click.option(
    "--slurm",
    "release",
    type=click.Choice(images.SUPPORTED),
    default=images.HOST_RELEASE,
    show_default=True,
    help="Slurm release to run: the host's own, or another from its image (built from "
    "Debian's packages on first use, ~30 s, then cached in " + str(images.CACHE) + ").",
)
@json_option
@click.pass_context
def up(ctx: click.Context, timeout: float, release: str, as_json: bool) -> None:
    """Start the lab (idempotent: an up lab of the same release is left as it is; one of
    another release is taken down first)."""
    lab = _lab(ctx, release=release)
    try:
        status = lab.up(timeout=timeout)
    except (LabError, RuntimeError, TimeoutError, OSError) as exc:
        fail(
            f"lab up failed: {exc}\n  logs: {lab.paths.failed_up_logs} (what it had started "
            "is removed; if 'lab status' shows anything left: 'slurm-burst lab down')",
            EXIT_FAILED,
        )
    _print_status(status, as_json)
    if not as_json:
        click.echo(
            f"\nexport SLURM_CONF={status['slurm_conf']} PATH={status['slurm_bin']}:$PATH"
            f"   # Slurm {status['slurm_release']}'s commands; then: sinfo, sbatch, squeue"
        )


@group.command("down")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def down(ctx: click.Context, yes: bool) -> None:
    """Stop the lab and remove every process, namespace, link and file it created."""
    lab = _lab(ctx)
    if not yes and sys.stdin.isatty():
        click.confirm(f"Destroy the lab under {lab.paths.state} and all its VMs?", abort=True)
    removed = lab.down()
    click.echo(f"lab: removed {len(removed)} item(s)" + "".join(f"\n  {r}" for r in removed))


@group.command("images")
@click.option(
    "--slurm",
    "releases",
    type=click.Choice(tuple(images.RELEASES)),
    multiple=True,
    help="Only this release's image (repeat for more); default: every release's and the "
    "blank host's.",
)
@json_option
def images_cmd(releases: tuple[str, ...], as_json: bool) -> None:
    """Build the root filesystems the lab boots (each Slurm release's but the host's, and
    the blank host the deployment tests play onto), or find them in the cache. Each is
    built once, from the host's Debian mirror (~25 s to a minute each); a build already
    under way elsewhere is waited for. Exits 1 if one cannot be built."""
    done: list[dict[str, Any]] = []
    for name in releases or ("", *images.RELEASES):  # "": the blank host, first
        what = f"Slurm {name}" if name else "blank host"
        t = time.monotonic()
        said: list[str] = []  # a build says its steps; the cache's image says nothing

        def say(msg: str, said: list[str] = said) -> None:
            said.append(msg)
            _say(msg)

        try:
            root = _image(name, say)
        except (images.ImageError, OSError) as exc:
            fail(f"lab images: {what}: {exc}", EXIT_FAILED)
        done.append({"image": what, "root": str(root), "built": bool(said),
                     "seconds": round(time.monotonic() - t, 1)})  # fmt: skip
        if not as_json:
            how = f"built in {done[-1]['seconds']} s" if said else "cached"
            click.echo(f"{what}: {root} ({how})")
    if as_json:
        emit(done, as_json=True)


def _say(msg: str) -> None:
    click.echo(f"lab: {msg}", err=True)


def _image(name: str, progress: Callable[[str], None] = _say) -> Path:
    """Slurm ``name``'s image, or the blank host's for ``""``."""
    return (
        images.ensure(name, progress=progress) if name else images.ensure_blank(progress=progress)
    )


@group.command("status")
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show the controller, nodes, VMs and their processes. Exits 3 when the lab is down."""
    lab = _lab(ctx, quiet=True)
    st = lab.status()
    _print_status(st, as_json)
    ctx.exit(0 if st["up"] else EXIT_PRECONDITION)


def _print_status(st: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(st, True)
        return
    click.echo(
        f"lab: {'UP' if st['up'] else 'DOWN'}  state: {st['state_dir']}"
        + (f"  Slurm {st['slurm_release']}" if "slurm_release" in st else "")
    )
    if "processes" not in st:
        return
    rows = [
        (name, p["pid"], "running" if p["alive"] else "DEAD") for name, p in st["processes"].items()
    ]
    rows += [
        (f"on-prem {name}", o["launcher_pid"], o["vm"] if o["alive"] else "DEAD")
        for name, o in st["onprem"].items()
    ]
    emit(rows, False, columns=["process", "pid", "state"], rows=lambda r: r, title="Processes")
    emit(
        st["slurm_nodes"],
        False,
        columns=["node", "state", "partitions", "addr"],
        rows=lambda ns: [
            (n.get("name"), n.get("state"), ",".join(n.get("partitions", [])), n.get("addr"))
            for n in ns
        ],
        title="Slurm nodes",
    )
    if st["cloud_vms"]:
        emit(
            st["cloud_vms"],
            False,
            columns=["vm", "name", "state", "ip", "size"],
            rows=lambda vs: [
                (v["id"], v["name"], v["state"], ",".join(v["ip"]), v["size"]) for v in vs
            ],
            title="Cloud VMs",
        )
