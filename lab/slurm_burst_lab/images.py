"""Root filesystems of the Slurm releases a site runs, built from Debian's own packages.

The host is Debian bookworm (Slurm 22.05). Slurm 24.11 comes from trixie and the newest
release Debian carries (named here, not a moving target: 26.05, from sid) from sid,
each as a root filesystem made by ``mmdebstrap`` from the host's own Debian mirror and
cached under ``/var/cache/slurm-burst/images/<release>`` (built once: ~25 s and ~250
MB each here; a stamp file says what is inside, and a half-built image is never used).
The lab runs that release's slurmctld in it (``lab.versioned``); cloud VMs booted from
it are the next step.

Where things run, per release: the daemon, the hooks and the prolog always run with the
host's Python (3.11, in the project's environment) and reach Slurm's commands of the
image's release through ``chroot``; the image's own Python (3.13 on trixie, 3.14 on
sid) runs nothing of ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_burst.adapters.proc import CommandError, run

log = logging.getLogger(__name__)

CACHE = Path("/var/cache/slurm-burst/images")
NEWEST = "26.05"  # the newest Slurm release Debian carries (sid, November 2026)
HOST_RELEASE = "22.05"  # bookworm's: the lab's default, no image needed
PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "slurm-client",
    "munge",
    "openssh-server",
    "wireguard-tools",
    "wireguard-go",  # VMs: no WireGuard kernel module in the lab's namespaces
    "iproute2",
    "procps",  # the bootstrap's pgrep
    "python3",
    "mount",  # VMs mount their /run and /tmp (sid no longer installs it by default)
    "lua-posix",  # burst_buffer.lua's data_in runs the stage-in program with it
    # the training job across burst nodes (examples/training): MPI ranks in the VMs,
    # srun --mpi=pmix (Slurm's plugin opens the unversioned libpmix.so, libpmix-dev's)
    "openmpi-bin",
    "python3-mpi4py",
    "python3-numpy",
    "libpmix-dev",
)
# what the lab runs inside an image: a build without one of them is refused
PROGRAMS = (
    "usr/bin/mount", "usr/bin/python3", "usr/sbin/chroot", "usr/sbin/runuser",
    "usr/sbin/sshd", "usr/bin/ssh-keygen", "usr/bin/pgrep", "usr/bin/wg",
    "usr/bin/wireguard-go", "usr/sbin/munged", "usr/sbin/slurmd", "usr/sbin/slurmctld",
    "usr/sbin/slurmdbd", "usr/bin/sbatch", "usr/sbin/ip",
)  # fmt: skip
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass(frozen=True)
class Release:
    slurm: str  # "24.11"
    suite: str  # the Debian suite that carries it


RELEASES = {"24.11": Release("24.11", "trixie"), NEWEST: Release(NEWEST, "sid")}
SUPPORTED = (HOST_RELEASE, *RELEASES)


class ImageError(RuntimeError):
    """An image cannot be built or used; the message says why and what to do."""


def release(name: str) -> Release:
    if name not in RELEASES:
        raise ImageError(
            f"no image for Slurm {name!r}: the lab runs {', '.join(SUPPORTED)} "
            f"({HOST_RELEASE} is the host's own)"
        )
    return RELEASES[name]


def host_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The Debian archive the host's apt uses (deb822 ``debian.sources`` or a classic
    ``sources.list``), so that images come from the same mirror as the host's packages."""
    for path in sorted((sources / "sources.list.d").glob("*.sources")):
        for block in path.read_text(errors="replace").split("\n\n"):
            fields = dict(
                line.split(":", 1)
                for line in block.splitlines()
                if ":" in line and not line.startswith("#")
            )
            uris = fields.get("URIs", "").split()
            if uris and "security" not in uris[0] and "Types" in fields:
                return uris[0]
    classic = sources / "sources.list"
    if classic.exists():
        for line in classic.read_text(errors="replace").splitlines():
            m = re.match(r"deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", line.strip())
            if m and "security" not in m.group(1):
                return m.group(1)
    raise ImageError(f"no Debian mirror found in {sources}; add one to apt's sources")


def image_dir(name: str, cache: Path = CACHE) -> Path:
    return cache / release(name).slurm


def stamp(root: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((root / "etc" / "slurm-burst-image.json").read_text()))
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _one_builder(root: Path) -> Iterator[None]:
    """Held while ``root`` is looked at and built: one build of an image at a time across
    processes (``make test`` builds the images beside the first tests, which may ask for
    one meanwhile: they wait for that build, then find it)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root.parent / f".{root.name}.lock", flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure(name: str, cache: Path = CACHE, progress: Callable[[str], None] = log.info) -> Path:
    """The root filesystem of Slurm ``name``, built if the cache has none; returns it."""
    root = image_dir(name, cache)
    with _one_builder(root):
        return _ensure(name, root, progress)


def _ensure(name: str, root: Path, progress: Callable[[str], None]) -> Path:
    rel = release(name)
    have = stamp(root)
    if (
        have is not None
        and have.get("slurm", "").startswith(rel.slurm + ".")
        and have.get("packages") == list(PACKAGES)
    ):
        return root

    def check(tmp: Path) -> dict[str, Any]:
        version = run(["chroot", str(tmp), "slurmctld", "-V"]).stdout.split()
        got = version[1] if len(version) > 1 else "?"
        if not got.startswith(rel.slurm + "."):
            raise ImageError(f"{rel.suite} carries Slurm {got}, not {rel.slurm}: update RELEASES")
        return {"slurm": got}

    return _build(f"Slurm {rel.slurm}", rel.suite, PACKAGES, PROGRAMS, root, check, progress)


# A blank host (the Ansible deployment's target): Debian as a cloud image would boot it,
# systemd as PID 1, sshd and python3, nothing of Slurm or of ours. python3-apt as Debian's
# cloud images have it (unattended-upgrades needs it): without it, Ansible's apt module
# runs `apt-get update` against the Debian mirror and installs it, in every play's first
# apt task (the deployment's site.yml took 131 s in one run here, 18 s without that).
BLANK_SUITE = "bookworm"
BLANK_PACKAGES = ("systemd-sysv", "dbus", "openssh-server", "python3", "python3-apt", "iproute2")
BLANK_PROGRAMS = ("usr/lib/systemd/systemd", "usr/sbin/sshd", "usr/bin/python3")
# A cloud image's kernel package provides WireGuard (Debian's linux-image-* Provides
# wireguard-modules). The blank host runs the lab host's kernel and has no kernel
# package, so apt would install one (and build its initramfs, a minute a host) for
# wireguard-tools' Recommends: a package of ours says what the kernel provides instead.
BLANK_PROVIDES = ("wireguard-modules (= 1.0.0)",)
BLANK_KERNEL = "slurm-burst-lab-kernel"
# What the Ansible deployment's plays install (tests/lab/deploy/site.yml, the controller
# and node_image roles), downloaded into the blank host's apt cache with their
# recommends, and its package lists kept: as behind a site's local mirror or apt proxy,
# a deployment installs them without fetching them again from the Debian mirror (3.7 to
# 14.7 minutes a run here). Installed, none of them is: the plays still do all of that.
BLANK_CACHED = (
    "slurmctld", "slurmdbd", "slurm-client", "munge", "mariadb-server", "lua-posix",
    "python3-venv", "python3-packaging", "wireguard-tools", "wireguard-go", "iproute2",
    "procps", "openssh-server", "cloud-init", "slurmd",
)  # fmt: skip


def _provides_hook(package: str, provides: Sequence[str]) -> str:
    """A customize hook that installs ``package``, empty, providing ``provides``."""
    control = (
        f"Package: {package}\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: slurm-burst lab <root@localhost>\n"
        f"Provides: {', '.join(provides)}\n"
        "Description: the kernel a lab VM runs on (the host's), as a package\n"
    )
    return (
        'mkdir -p "$1/tmp/kernel/DEBIAN" && '
        f'printf %s {shlex.quote(control)} > "$1/tmp/kernel/DEBIAN/control" && '
        'chroot "$1" dpkg-deb --build /tmp/kernel /tmp/kernel.deb >/dev/null && '
        'chroot "$1" dpkg -i /tmp/kernel.deb >/dev/null && '
        'rm -rf "$1/tmp/kernel" "$1/tmp/kernel.deb"'
    )


def ensure_blank(cache: Path = CACHE, progress: Callable[[str], None] = log.info) -> Path:
    """The blank host's root filesystem, built if the cache has none; returns it."""
    root = cache / f"blank-{BLANK_SUITE}"
    with _one_builder(root):
        return _ensure_blank(root, progress)


def _ensure_blank(root: Path, progress: Callable[[str], None]) -> Path:
    have = stamp(root)
    if (
        have is not None
        and have.get("packages") == list(BLANK_PACKAGES)
        and have.get("provides") == list(BLANK_PROVIDES)
        and have.get("cached") == list(BLANK_CACHED)
    ):
        return root

    def check(tmp: Path) -> dict[str, Any]:
        got = run(["chroot", str(tmp), "dpkg-query", "-W", "-f", "${Provides}", BLANK_KERNEL],
                  check=False).stdout.strip()  # fmt: skip
        if got != ", ".join(BLANK_PROVIDES):
            raise ImageError(f"the blank host's {BLANK_KERNEL} provides {got!r}, not "
                             f"{', '.join(BLANK_PROVIDES)!r}")  # fmt: skip
        debs = list((tmp / "var" / "cache" / "apt" / "archives").glob("*.deb"))
        if not any(d.name.startswith("slurmctld_") for d in debs):
            raise ImageError("the blank host's apt cache holds no slurmctld package")
        return {"provides": list(BLANK_PROVIDES), "cached": list(BLANK_CACHED)}

    download = (
        'chroot "$1" apt-get install --download-only --yes --quiet '
        "-o APT::Install-Recommends=true " + " ".join(BLANK_CACHED) + " >/dev/null"
    )
    return _build("a blank host", BLANK_SUITE, BLANK_PACKAGES, BLANK_PROGRAMS, root, check,
                  progress, [_provides_hook(BLANK_KERNEL, BLANK_PROVIDES), download],
                  keep=("cleanup/apt/lists", "cleanup/apt/cache"))  # fmt: skip


def _build(
    what: str,
    suite: str,
    packages: tuple[str, ...],
    programs: tuple[str, ...],
    root: Path,
    check: Callable[[Path], dict[str, Any]],
    progress: Callable[[str], None],
    hooks: Sequence[str] = (),
    keep: Sequence[str] = (),
) -> Path:
    """mmdebstrap ``suite`` with ``packages`` into ``root`` (built aside, then moved in
    whole: a half-built image is never used); ``check`` says what the stamp records, or
    raises ImageError. ``hooks``: more of mmdebstrap's customize hooks (``$1``: the root);
    ``keep``: mmdebstrap's cleanup steps to skip (``cleanup/apt/cache``: its .debs)."""
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is missing: run scripts/setup-system.sh (make setup)")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.building.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    mirror = host_mirror()
    progress(f"image: building {what} ({suite}) from {mirror}")
    t = time.monotonic()
    argv = [
        "mmdebstrap",
        "--variant=apt",
        "--quiet",
        "--include=" + ",".join(packages),
        # the mirror may be a fixed snapshot whose Release files have expired (sid's do)
        '--aptopt=Acquire::Check-Valid-Until "false"',
        # each machine booted from the image makes its own
        '--customize-hook=rm -f "$1"/etc/machine-id',
        *(f"--customize-hook={h}" for h in hooks),
        *(f"--skip={step}" for step in keep),
        suite,
        str(tmp),
        f"deb [signed-by={KEYRING}] {mirror} {suite} main",
    ]
    try:
        run(argv, timeout=900)
        missing = [p for p in programs if not (tmp / p).exists()]
        if missing:
            raise ImageError(f"the image of {what} lacks {', '.join(missing)}: add their "
                             "packages")  # fmt: skip
        info = {**check(tmp), "suite": suite, "mirror": mirror, "packages": list(packages),
                "built_at": time.time()}  # fmt: skip
    except (CommandError, ImageError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ImageError(f"building the image of {what} failed: {exc}") from exc
    (tmp / "etc" / "slurm-burst-image.json").write_text(json.dumps(info) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    progress(f"image: {what} ready in {time.monotonic() - t:.0f} s at {root}")
    return root
