"""The Slurm release the lab runs: the host's own, or another one from its image.

The lab's config names ``slurm.bin_dir = <state>/slurm/bin``: the commands of whichever
release the lab runs, so that the daemon, the CLI and the tests never need to know.

* **The host's release** (22.05 on bookworm): ``bin/`` and ``sbin/`` hold symlinks to
  ``/usr/bin`` and ``/usr/sbin``; slurmctld and slurmdbd run as they always did.
* **Another release** (``lab up --slurm 24.11``): the controller host is that release's
  image (``lab.images``), seen through a private overlay at ``<state>-slurm/root`` (the
  image itself stays read-only and shared with the VMs). Bound into it: /proc, /dev,
  the host's MariaDB socket, /tmp, the lab's state and shared directories (same paths
  inside as outside), and, last, the host's whole tree at ``/host``. slurmctld and
  slurmdbd run there through ``chroot``. The commands in ``bin/`` are small programs of
  the host's Python that ``chroot`` into it, keep the caller's working directory when
  it exists there, and exec that release's command with the same argv (no shell).

Our programs that slurm.conf names (the hooks and the PrologSlurmctld) need the
controller host's Python and this project's environment, which the image does not hold:
inside the root, ``hook_dir`` shows trampolines, run by the image's own ``python3``,
that exec ``chroot /host <the real program>`` with Slurm's argv and environment. So the
hooks run exactly as on the host release; the image's Python runs nothing but the
trampoline. This is lab plumbing: a site on 24.11 runs Slurm natively on its controller.

The root is outside the state directory on purpose: ``/host`` holds the whole host, and
nothing that walks the lab's state (``lab down``'s removal included) may descend into
it. ``unmount`` detaches it all; ``remove_tree`` refuses to delete a tree with anything
still mounted below it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_burst.adapters.proc import CommandError, run
from slurm_burst_lab import images

# what the lab, the daemon, the CLI and the tests run from bin_dir (and sbin, for -V)
CLIENTS = (
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
    "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger",
)  # fmt: skip
DAEMONS = ("slurmctld", "slurmd", "slurmdbd")

_WRAPPER = """#!/usr/bin/python3 -IS
# Slurm {release}'s {name}, run in the lab's controller root (written by `slurm-burst lab up`)
import os
import sys

try:
    cwd = os.getcwd()
except OSError:
    cwd = "/"
try:
    os.chroot({root!r})
except PermissionError:
    sys.exit("{name}: the lab's Slurm {release} commands run as root (they chroot)")
as_user = os.environ.pop("SBLAB_AS_UID", "")  # "UID:GID": a user's command (tests)
if as_user:
    uid, gid = (int(x) for x in as_user.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
try:
    os.chdir(cwd)
except OSError:
    os.chdir("/")
os.execv({target!r}, [{name!r}, *sys.argv[1:]])
"""

_TRAMPOLINE = """#!/usr/bin/python3 -IS
# run by Slurm {release}'s slurmctld in the lab's controller root: the real program needs
# the host's Python, so leave for the host's tree (written by `slurm-burst lab up`)
import os
import sys

os.execv("/usr/sbin/chroot", ["chroot", "/host", {target!r}, *sys.argv[1:]])
"""


class RootError(RuntimeError):
    """The release's root cannot be set up or removed; the message says why."""


@dataclass(frozen=True)
class SlurmRoot:
    release: str
    state: Path  # the lab's state directory

    @property
    def host(self) -> bool:
        return self.release == images.HOST_RELEASE

    @property
    def bin(self) -> Path:
        return self.state / "slurm" / "bin"

    @property
    def sbin(self) -> Path:
        return self.state / "slurm" / "sbin"

    @property
    def trampolines(self) -> Path:
        return self.state / "slurm" / "hooks"

    @property
    def base(self) -> Path:
        """Where the overlay lives: beside the state directory, never inside it."""
        return self.state.with_name(self.state.name + "-slurm")

    @property
    def root(self) -> Path:
        return self.base / "root"

    def prefix(self) -> list[str]:
        """argv prefix that runs a program of this release (its daemons)."""
        return [] if self.host else ["chroot", str(self.root)]

    def image(self) -> Path | None:
        return None if self.host else images.image_dir(self.release)

    # -- set up ---------------------------------------------------------------------
    def setup(self, hook_dir: str, shared: list[str], progress: Callable[[str], None]) -> None:
        """Commands in bin/ and sbin/; for another release, its image (built once) and the
        controller root with everything bound in."""
        for d in (self.bin, self.sbin):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        if self.host:
            for name in CLIENTS:
                (self.bin / name).symlink_to(f"/usr/bin/{name}")
            for name in DAEMONS:
                (self.sbin / name).symlink_to(f"/usr/sbin/{name}")
            return
        image = images.ensure(self.release, progress=progress)
        self.mount(image, hook_dir, shared)
        for d, names in ((self.bin, CLIENTS), (self.sbin, DAEMONS)):
            for name in names:
                target = f"/usr/{d.name}/{name}"
                text = _WRAPPER.format(release=self.release, name=name, root=str(self.root),
                                       target=target)  # fmt: skip
                _write_program(d / name, text)

    def mount(self, image: Path, hook_dir: str, shared: list[str]) -> None:
        if mounted_under(self.base):
            self.unmount()
        shutil.rmtree(self.base, ignore_errors=True)
        try:
            overlay(image, self.base)
            binds = [("/proc", "--bind"), ("/dev", "--rbind"), ("/tmp", "--bind"),
                     (str(self.state), "--bind"), *((p, "--bind") for p in shared)]  # fmt: skip
            if Path("/run/mysqld").is_dir():  # slurmdbd reaches the host's MariaDB there
                binds += [("/run/mysqld", "--bind")]
                self._bind("/run/mysqld", "/run/mariadbd", "--bind")
            for src, how in binds:
                self._bind(src, src, how)
            # the hook programs slurm.conf names: trampolines to the host's programs
            shutil.rmtree(self.trampolines, ignore_errors=True)
            self.trampolines.mkdir(parents=True)
            for path in sorted(Path(hook_dir).iterdir()):
                text = _TRAMPOLINE.format(release=self.release, target=str(path))
                _write_program(self.trampolines / path.name, text)
            self._bind(str(self.trampolines), hook_dir, "--bind")
            self._bind("/", "/host", "--rbind")  # last: /host shows all of the above too
        except BaseException:
            self.unmount()
            raise

    def _bind(self, src: str, inside: str, how: str) -> None:
        target = self.root / inside.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        _mount(how, src, str(target))

    # -- tear down ------------------------------------------------------------------
    def unmount(self) -> None:
        """Detach the root and everything bound into it (idempotent)."""
        unmount_all(self.base)

    def remove(self) -> None:
        self.unmount()
        remove_tree(self.base)


def overlay(image: Path, base: Path) -> Path:
    """Mount a private overlay of ``image`` at ``base/root`` (its writes in
    ``base/upper``); returns ``base/root``."""
    upper, work, root = base / "upper", base / "work", base / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    _mount("-t", "overlay", "overlay", "-o", f"lowerdir={image},upperdir={upper},workdir={work}",
           str(root))  # fmt: skip
    return root


def _write_program(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)


def _mount(*args: str) -> None:
    try:
        run(["mount", *args], timeout=30)
    except CommandError as exc:
        raise RootError(f"mount {' '.join(args)}: {exc.stderr.strip() or exc.reason}") from exc


def mounted_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo), deepest first."""
    base = str(path.resolve()) if path.exists() else str(path)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].encode().decode("unicode_escape")
            if point == base or point.startswith(base + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def unmount_all(path: Path) -> None:
    """Lazily detach every mount at or below ``path``; RootError if any stays."""
    for point in reversed(mounted_under(path)):  # the top first: -R takes the rest
        with contextlib.suppress(CommandError):
            run(["umount", "--recursive", "--lazy", point], timeout=30)
    left = mounted_under(path)
    if left:
        raise RootError(f"still mounted below {path}: {', '.join(left[:5])}")


def remove_tree(path: Path) -> None:
    """``rmtree`` that refuses when anything is mounted at or below ``path`` (a bound
    /host or /dev must never be walked into)."""
    left = mounted_under(path)
    if left:
        raise RootError(f"not removing {path}: still mounted below it: {', '.join(left[:5])}")
    shutil.rmtree(path, ignore_errors=True)
