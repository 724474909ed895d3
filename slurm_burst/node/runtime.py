"""slurm-burst's runtime capture: what this node (or an unpacked image) runs, as a
runtime manifest (JSON on stdout). Run by ``slurm-burst runtime capture`` on an
on-prem reference node, and by the daemon on each burst node before its slurmd starts
(``--like REFERENCE``: the same fields and items the reference holds); the daemon, not
this program, compares them (``slurm_burst.core.runtime``).

Standard library only: the daemon copies this file to the node and runs it with the
node's ``python3``. Nothing here passes through a shell; every command has a timeout.

Fields, and where each is read (``--root DIR``: an image's files, for the fields that
files give; its kernel, driver and CUDA driver are not captured):

- ``os``: os-release's ``ID`` and ``VERSION_ID`` (or ``VERSION_CODENAME``);
- ``kernel``: ``uname -r``;
- ``glibc``: the running C library (``confstr``), or the version in an image's
  ``libc.so.6``;
- ``driver``, ``cuda_driver``: NVML (``libnvidia-ml.so.1`` through ctypes): the driver
  version and the highest CUDA it supports; ``""`` where no driver loads;
- ``cuda_runtime`` (major.minor), ``nccl`` (major.minor.patch): what the newest
  ``libcudart.so.N`` and ``libnccl.so.N`` say (``cudaRuntimeGetVersion``,
  ``ncclGetVersion``: no GPU needed), or in an image the version in their file names
  (``libnccl.so.2.19.3``); ``""`` where none is installed;
- ``mpi``: ``openmpi X.Y.Z`` from ``ompi_info``, else ``mpich X.Y.Z`` from
  ``mpichversion``, else dpkg's record of the library package (an image);
- ``python`` and ``packages``: the interpreter named by ``--python`` (default
  ``/usr/bin/python3``): its version and each listed distribution's version
  (``importlib.metadata``, run in that interpreter); in an image its dpkg version and
  its ``*.dist-info`` / ``*.egg-info`` directories;
- ``images``: each listed podman image (``--image REF:TAG``): podman's digest of it
  (a running node only; on a join they are loaded and checked after this step);
- ``libraries``: each listed soname or path, found in the library directories (those
  of ``/etc/ld.so.conf.d`` too): the real file's name and its SHA-256.

Exit 0 with the manifest; 2 bad usage or a reference that does not read.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import glob
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

SCHEMA = 1
EXIT_USAGE = 2
TIMEOUT = 20  # seconds for one command (ompi_info, the interpreter)
LIB_DIRS = (
    "/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib",
    "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
    "/usr/local/cuda/lib64", "/usr/local/nvidia/lib64",
)  # fmt: skip
MAX_LINKS = 40
PACKAGES_SNIPPET = (
    "import sys, json, platform\n"
    "from importlib import metadata\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        out[name] = metadata.version(name)\n"
    "    except Exception:\n"
    "        out[name] = ''\n"
    "print(json.dumps({'python': platform.python_version(), 'packages': out}))\n"
)


def _run(argv: list[str]) -> str:
    """A command's stdout, or "" where it is missing, fails or hangs."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, ValueError, subprocess.SubprocessError):  # ValueError: a NUL in argv
        return ""
    return done.stdout if done.returncode == 0 else ""


class Root:
    """Paths as seen from ``top`` (``/`` on a live node): symbolic links are followed
    inside it, an absolute target taken relative to it, never to this host."""

    def __init__(self, top: str) -> None:
        self.top = os.path.abspath(top)
        self.live = self.top == "/"

    def resolve(self, path: str) -> str | None:
        """``path`` (absolute, as inside the root) with every link followed, as a path
        on this host; None if it does not exist or loops."""
        parts = [p for p in path.split("/") if p]
        done = ""
        links = 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                done = done.rsplit("/", 1)[0]
                continue
            here = f"{done}/{part}"
            host = self.top.rstrip("/") + here
            try:
                target = os.readlink(host)
            except FileNotFoundError:
                return None
            except OSError:  # not a link
                done = here
                continue
            links += 1
            if links > MAX_LINKS:
                return None
            if target.startswith("/"):
                done = ""
            parts = [p for p in target.split("/") if p] + parts
        host = self.top.rstrip("/") + (done or "/")
        return host if os.path.exists(host) else None

    def read(self, path: str, limit: int = 1 << 20) -> str:
        real = self.resolve(path)
        if real is None or not os.path.isfile(real):
            return ""
        with open(real, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")

    @functools.cached_property
    def lib_dirs(self) -> list[str]:
        """The library directories, ld.so.conf.d's too (read once: every lookup uses them)."""
        dirs = list(LIB_DIRS)
        for conf in sorted(glob.glob(self.top.rstrip("/") + "/etc/ld.so.conf.d/*.conf")):
            inner = "/" + os.path.relpath(conf, self.top)
            for line in self.read(inner).splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("/") and line not in dirs:
                    dirs.append(line)
        return dirs

    def find_lib(self, name: str) -> str | None:
        """The real file (host path) of soname or path ``name``."""
        if name.startswith("/"):
            return self.resolve(name)
        for d in self.lib_dirs:
            real = self.resolve(f"{d}/{name}")
            if real is not None and os.path.isfile(real):
                return real
        return None

    def find_versioned(self, stem: str) -> tuple[str, str]:
        """(the version in the file name, the real file) of the newest ``stem.N[.M...]``
        installed; ("", "") none."""
        best: tuple[tuple[int, ...], str, str] | None = None
        pattern = re.compile(re.escape(stem) + r"\.(\d+(?:\.\d+)*)")
        for d in self.lib_dirs:
            for path in glob.glob(self.top.rstrip("/") + f"{d}/{stem}.*"):
                m = pattern.fullmatch(os.path.basename(path))
                real = self.find_lib("/" + os.path.relpath(path, self.top)) if m else None
                if m is None or real is None:
                    continue
                version = (pattern.fullmatch(os.path.basename(real)) or m).group(1)
                key = tuple(int(x) for x in version.split("."))
                if best is None or key > best[0]:
                    best = (key, version, real)
        return (best[1], best[2]) if best else ("", "")

    @functools.cached_property
    def dpkg_packages(self) -> list[dict[str, str]]:
        """dpkg's records (its status file, read and split once)."""
        text = self.read("/var/lib/dpkg/status", 64 << 20)
        return [
            dict(
                line.split(": ", 1)
                for line in block.splitlines()
                if ": " in line and line[0] != " "
            )
            for block in text.split("\n\n")
        ]

    def dpkg_version(self, pattern: str) -> str:
        """The upstream version (no epoch, no Debian revision) of the first installed
        package whose name matches ``pattern``; "" none."""
        for fields in self.dpkg_packages:
            # "install ok installed"; not "purge ok not-installed" nor "config-files"
            installed = fields.get("Status", "").endswith(" installed")
            if installed and re.fullmatch(pattern, fields.get("Package", "")):
                version = fields.get("Version", "").split(":", 1)[-1]
                return version.rsplit("-", 1)[0] if "-" in version else version
        return ""


def os_release(root: Root) -> str:
    text = root.read("/etc/os-release") or root.read("/usr/lib/os-release")
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("\"'")
    ident = values.get("ID", "")
    release = values.get("VERSION_ID") or values.get("VERSION_CODENAME") or "unknown"
    return f"{ident} {release}" if ident else ""


def glibc(root: Root) -> str:
    if root.live:
        said = os.confstr("CS_GNU_LIBC_VERSION") or ""
        return said.split()[-1] if said.startswith("glibc ") else ""
    real = root.find_lib("libc.so.6")
    if real is None:
        return ""
    with open(real, "rb") as f:
        m = re.search(rb"release version (\d+\.\d+(?:\.\d+)?)", f.read(16 << 20))
    return m.group(1).decode() if m else ""


def nvml() -> tuple[str, str]:
    """(driver version, highest CUDA it supports) from NVML; ("", "") without a driver."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return "", ""
    try:
        init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
        if init() != 0:
            return "", ""
        buf = ctypes.create_string_buffer(96)
        driver = buf.value.decode() if lib.nvmlSystemGetDriverVersion(buf, 96) == 0 else ""
        cuda = ctypes.c_int(0)
        get = getattr(lib, "nvmlSystemGetCudaDriverVersion_v2", None) or getattr(
            lib, "nvmlSystemGetCudaDriverVersion", None
        )
        said = ""
        if get is not None and get(ctypes.byref(cuda)) == 0 and cuda.value > 0:
            said = f"{cuda.value // 1000}.{cuda.value % 1000 // 10}"
        lib.nvmlShutdown()
        return driver, said
    except AttributeError:
        return "", ""


def _library_version(path: str, call: str) -> int:
    """What ``call(int *)`` of the library at ``path`` says (0: it does not load or
    answer): cudaRuntimeGetVersion and ncclGetVersion need no GPU."""
    try:
        lib = ctypes.CDLL(path)
        value = ctypes.c_int(0)
        return value.value if getattr(lib, call)(ctypes.byref(value)) == 0 else 0
    except (OSError, AttributeError):
        return 0


def cuda_runtime(root: Root) -> str:
    """libcudart's version as major.minor (CUDA's own numbering, 12040 = 12.4)."""
    version, real = root.find_versioned("libcudart.so")
    code = _library_version(real, "cudaRuntimeGetVersion") if root.live and real else 0
    if code:
        return f"{code // 1000}.{code % 1000 // 10}"
    return ".".join(version.split(".")[:2])


def nccl(root: Root) -> str:
    """NCCL's version, major.minor.patch (its code: 21903 = 2.19.3; 2.8 and older 2803)."""
    version, real = root.find_versioned("libnccl.so")
    code = _library_version(real, "ncclGetVersion") if root.live and real else 0
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    if code:
        return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    return version


def mpi(root: Root) -> str:
    if root.live:
        for line in _run(["ompi_info", "--parsable", "--version"]).splitlines():
            if line.startswith("ompi:version:full:"):
                return "openmpi " + line.rsplit(":", 1)[1].strip()
        m = re.search(r"MPICH Version:\s*(\S+)", _run(["mpichversion"]))
        if m:
            return "mpich " + m.group(1)
    for impl, pattern in (("openmpi", r"libopenmpi\d+"), ("mpich", r"libmpich\d+")):
        version = root.dpkg_version(pattern)
        if version:
            return f"{impl} {version}"
    return ""


def python_and_packages(root: Root, python: str, names: list[str]) -> tuple[str, dict[str, str]]:
    if root.live:
        said = _run([python, "-I", "-c", PACKAGES_SNIPPET, *names]).strip().splitlines()
        try:
            doc = json.loads(said[-1]) if said else {}
            return str(doc["python"]), {n: str(doc["packages"].get(n, "")) for n in names}
        except (ValueError, KeyError, TypeError, AttributeError):
            return "", {n: "" for n in names}
    real = root.resolve(python)
    base = os.path.basename(real) if real else ""
    m = re.fullmatch(r"python(\d+\.\d+)", base)
    version = root.dpkg_version(re.escape(base)) if m else ""
    found: dict[str, str] = {}
    for info in glob.glob(root.top.rstrip("/") + "/usr/**/*-packages/*.*-info", recursive=True):
        dist, _, rest = os.path.basename(info).partition("-")
        ver = re.sub(r"(\.dist-info|\.egg-info)$", "", rest).split("-py")[0]
        found.setdefault(_norm(dist), ver)
    return version, {n: found.get(_norm(n), "") for n in names}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def library(root: Root, name: str) -> str:
    real = root.find_lib(name)
    if real is None or not os.path.isfile(real):
        return ""
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return f"{os.path.basename(real)} {digest.hexdigest()}"


def image_digest(root: Root, ref: str) -> str:
    """podman's digest of the local image ``ref`` (a running node only); "" none."""
    if not root.live:
        return ""
    said = _run(["podman", "image", "inspect", "--format", "{{.Digest}}", ref]).strip()
    return said if re.fullmatch(r"sha256:[0-9a-f]{64}", said) else ""


def capture(
    root: Root,
    python: str,
    libraries: list[str],
    packages: list[str],
    fields: set[str] | None,
    images: Sequence[str] = (),
) -> dict[str, Any]:
    """The manifest; ``fields``: only these scalars (a reference's), None: all."""

    def wanted(name: str) -> bool:
        return fields is None or name in fields

    doc: dict[str, Any] = {
        "slurm_burst_runtime": SCHEMA,
        "host": socket.gethostname() if root.live else "",
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": "node" if root.live else f"image {root.top}",
        "python_path": python,
    }
    if wanted("os"):
        doc["os"] = os_release(root)
    if root.live and wanted("kernel"):
        doc["kernel"] = os.uname().release
    if wanted("glibc"):
        doc["glibc"] = glibc(root)
    if root.live and (wanted("driver") or wanted("cuda_driver")):
        driver, cuda = nvml()
        if wanted("driver"):
            doc["driver"] = driver
        if wanted("cuda_driver"):
            doc["cuda_driver"] = cuda
    if wanted("cuda_runtime"):
        doc["cuda_runtime"] = cuda_runtime(root)
    if wanted("nccl"):
        doc["nccl"] = nccl(root)
    if wanted("mpi"):
        doc["mpi"] = mpi(root)
    if wanted("python") or packages:
        version, versions = python_and_packages(root, python, packages)
        if wanted("python"):
            doc["python"] = version
        doc["packages"] = versions
    doc["libraries"] = {name: library(root, name) for name in libraries}
    if images:
        doc["images"] = {ref: image_digest(root, ref) for ref in images}
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runtime.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture", help="print this node's runtime manifest")
    cap.add_argument("--root", default="/", help="an unpacked image instead of this node")
    cap.add_argument("--python", default="/usr/bin/python3", help="the jobs' interpreter")
    cap.add_argument("--library", action="append", default=[], help="a soname or path")
    cap.add_argument("--package", action="append", default=[], help="a Python distribution")
    cap.add_argument("--image", action="append", default=[], help="a podman image (REF:TAG)")
    cap.add_argument("--like", help="capture what this reference manifest holds")
    args = parser.parse_args(argv)
    libraries, packages, python = list(args.library), list(args.package), args.python
    images = list(args.image)
    fields: set[str] | None = None
    if args.like:
        try:
            with open(args.like, encoding="utf-8") as f:
                ref = json.loads(f.read(8 << 20))
            fields = {k for k in ref if isinstance(ref.get(k), str)}
            libraries += [str(n) for n in ref.get("libraries", {})]
            packages += [str(n) for n in ref.get("packages", {})]
            images += [str(n) for n in ref.get("images", {})]
            python = str(ref.get("python_path") or python)
        except (OSError, ValueError, AttributeError) as exc:
            print(f"runtime.py: the reference {args.like}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if not os.path.isdir(args.root):
        print(f"runtime.py: {args.root} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    root = Root(args.root)
    doc = capture(
        root, python, sorted(set(libraries)), sorted(set(packages)), fields, sorted(set(images))
    )
    print(json.dumps(doc, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
